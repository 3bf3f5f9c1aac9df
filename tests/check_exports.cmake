# Every dynamic symbol libstowage.so defines is stowage's: the C ABI (stowage_*) or the stowage::
# C++ API with its type information, vtables and thunks; fmt, spdlog, nlohmann-json and standard
# library instantiations stay inside. The C ABI that frameworks load by name must all be there.
find_program(NM nm REQUIRED)
execute_process(COMMAND ${NM} -D -C --defined-only ${LIBRARY} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIBRARY}")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(foreign)
set(count 0)
foreach(line IN LISTS lines)
  if(line STREQUAL "")
    continue()
  endif()
  string(REGEX REPLACE "^[0-9a-f]* *[A-Za-z] " "" name "${line}")
  math(EXPR count "${count} + 1")
  if(NOT name MATCHES "^(stowage_|stowage::|(typeinfo|typeinfo name|vtable|VTT|guard variable) for stowage::|(non-)?virtual thunk to stowage::)")
    list(APPEND foreign "${name}")
  endif()
endforeach()
list(LENGTH foreign n)
if(n GREATER 0)
  list(SUBLIST foreign 0 20 shown)
  string(REPLACE ";" "\n  " shown "${shown}")
  message(FATAL_ERROR "${n} of ${count} exported symbols are not stowage's, e.g.:\n  ${shown}")
endif()
foreach(fn stowage_malloc stowage_free stowage_record_stream stowage_empty_cache stowage_get_stats
           stowage_snapshot_json stowage_set_memory_fraction stowage_push_tag stowage_pop_tag stowage_dlpack_empty
           stowage_host_malloc stowage_host_free stowage_dlpack_host_empty stowage_host_stats
           stowage_host_release_unused stowage_host_device_pointer stowage_block_device stowage_last_error stowage_last_error_code
           stowage_dlpack_capsule_destructor)
  if(NOT out MATCHES "[ \n]${fn}\n")
    message(FATAL_ERROR "${fn} is not exported")
  endif()
endforeach()
message(STATUS "${count} exported symbols, all stowage's")
