# The layers of libstowage, lowest first, and what each may use (docs/architecture.md). Data flows
# down: a layer names only layers listed before it. StowageLibrary.cmake builds one target per
# layer from this table; tests/check_layering.cmake checks every source's includes against it.
set(STOWAGE_LAYERS common device allocator simd precision recompute offload runtime)
set(stowage_uses_common)
set(stowage_uses_device common)
set(stowage_uses_allocator device)
set(stowage_uses_simd common)
set(stowage_uses_precision allocator simd)
set(stowage_uses_recompute allocator simd)
set(stowage_uses_offload precision)
set(stowage_uses_runtime offload recompute)

# `out` = the layers `layer` may include: itself and everything below it, transitively.
function(stowage_layer_closure out)
  set(result)
  set(todo ${ARGN})
  while(todo)
    list(POP_FRONT todo l)
    if(NOT l IN_LIST result)
      list(APPEND result ${l})
      list(APPEND todo ${stowage_uses_${l}})
    endif()
  endwhile()
  set(${out} ${result} PARENT_SCOPE)
endfunction()
