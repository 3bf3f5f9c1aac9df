# Data flows down: tools -> {precision, recompute, offload} -> allocator -> device.
add_test(NAME layering COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -P ${PROJECT_SOURCE_DIR}/tests/check_layering.cmake)
