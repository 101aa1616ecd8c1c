# Finds a CUDA toolkit and picks the GPU architectures to build for.
#
# CMAKE_CUDA_ARCHITECTURES defaults to every architecture of
# 52;61;70;75;80;86;89;90 that the found nvcc can target (CUDA 13 starts at 75,
# CUDA 11.8 reaches down to 52 for the Tesla M40). Pass it explicitly to
# override, e.g. -DCMAKE_CUDA_ARCHITECTURES=90.
set(M40_HAVE_CUDA OFF)
if(NOT M40_CUDA)
  message(STATUS "m40-llm: CUDA backend disabled (-DM40_CUDA=OFF)")
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "m40-llm: no CUDA toolkit found, building without the CUDA backend")
  return()
endif()

set(m40_wanted_archs 52 61 70 75 80 86 89 90)
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --list-gpu-arch
                  OUTPUT_VARIABLE m40_nvcc_archs RESULT_VARIABLE m40_rc ERROR_QUIET)
  set(m40_archs "")
  if(m40_rc EQUAL 0)
    foreach(a IN LISTS m40_wanted_archs)
      if(m40_nvcc_archs MATCHES "compute_${a}([^0-9]|$)")
        list(APPEND m40_archs ${a})
      endif()
    endforeach()
  endif()
  if(NOT m40_archs)
    set(m40_archs 75)
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${m40_archs}" CACHE STRING "GPU architectures to build for")
endif()

set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# The M40 build carries no CUDA library but the runtime, linked statically.
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
enable_language(CUDA)
set(M40_HAVE_CUDA ON)
message(STATUS "m40-llm: CUDA backend with ${CMAKE_CUDA_COMPILER} "
               "(${CMAKE_CUDA_COMPILER_VERSION}) for architectures ${CMAKE_CUDA_ARCHITECTURES}")
