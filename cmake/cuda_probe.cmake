# gwtf_cuda_probe(OK_VAR REASON_VAR): configures cmake/cuda_probe with the
# CUDA compiler check_language found. OK_VAR is TRUE when that works;
# otherwise REASON_VAR holds the first lines of CMake's error. Success is
# cached per compiler, module path and architectures; a failure probes again
# at the next configure (the user may have fixed the toolkit).
function(gwtf_cuda_probe ok_var reason_var)
  set(key "${CMAKE_CUDA_COMPILER}|${CMAKE_MODULE_PATH}|${GWTF_CUDA_ARCHITECTURES}")
  if(DEFINED CACHE{GWTF_CUDA_PROBE_OK_FOR} AND GWTF_CUDA_PROBE_OK_FOR STREQUAL key)
    set(${ok_var} TRUE PARENT_SCOPE)
    set(${reason_var} "" PARENT_SCOPE)
    return()
  endif()
  set(dir ${CMAKE_BINARY_DIR}/cuda_probe)
  file(REMOVE_RECURSE ${dir})
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S ${PROJECT_SOURCE_DIR}/cmake/cuda_probe -B ${dir}
            -G ${CMAKE_GENERATOR}
            -DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}
            -DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}
            "-DCMAKE_CUDA_ARCHITECTURES=${GWTF_CUDA_ARCHITECTURES}"
            "-DCMAKE_MODULE_PATH=${CMAKE_MODULE_PATH}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    set(GWTF_CUDA_PROBE_OK_FOR "${key}" CACHE INTERNAL "")
    set(${ok_var} TRUE PARENT_SCOPE)
    set(${reason_var} "" PARENT_SCOPE)
  else()
    string(REGEX REPLACE "\n\n+" "\n" reason "${err}")
    string(SUBSTRING "${reason}" 0 800 reason)
    string(STRIP "${reason}" reason)
    set(${ok_var} FALSE PARENT_SCOPE)
    set(${reason_var} "${reason}" PARENT_SCOPE)
  endif()
endfunction()
