# Fails when a lower layer includes a private header of a higher one.
set(rules
  "allocator:precision/;recompute/;offload/;tools/"
  "precision:recompute/;offload/;tools/"
  "recompute:precision/;offload/;tools/"
  "offload:recompute/;tools/"
)
set(bad 0)
foreach(rule IN LISTS rules)
  string(REPLACE ":" ";" parts "${rule}")
  list(GET parts 0 layer)
  list(SUBLIST parts 1 -1 forbidden)
  file(GLOB files ${ROOT}/${layer}/*.cpp ${ROOT}/${layer}/*.hpp ${ROOT}/${layer}/*.cu ${ROOT}/${layer}/*.cuh)
  foreach(f IN LISTS files)
    file(STRINGS ${f} includes REGEX "^#include \"")
    foreach(inc IN LISTS includes)
      foreach(fb IN LISTS forbidden)
        if(inc MATCHES "\"${fb}")
          message(SEND_ERROR "${f}: ${inc} reaches up into ${fb}")
          set(bad 1)
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "layering violated")
endif()
message(STATUS "layering ok")
