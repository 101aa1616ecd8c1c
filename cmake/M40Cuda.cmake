# Finds a CUDA toolkit and picks the GPU architectures to build for.
#
# Of the architectures 52;60;61;70;75;80;86;89;90, the lowest that the found
# nvcc can target (CUDA 11.8: 52, the Tesla M40; CUDA 13: 75) becomes
# CMAKE_CUDA_ARCHITECTURES: its machine code plus its PTX. The others go to
# M40_CUDA_EXTRA_SASS: machine code compiled by ptxas from that same PTX,
# so a newer GPU runs exactly the code the tests ran, without waiting for
# the driver to compile the PTX at start (a GPU newer than the list still
# does). Pass either explicitly to override, e.g.
# -DCMAKE_CUDA_ARCHITECTURES=90 -DM40_CUDA_EXTRA_SASS= for an H100 only.
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

set(m40_wanted_archs 52 60 61 70 75 80 86 89 90)
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
  list(POP_FRONT m40_archs m40_ptx_arch)
  set(CMAKE_CUDA_ARCHITECTURES "${m40_ptx_arch}" CACHE STRING "GPU architectures to build for (machine code and PTX)")
  set(M40_CUDA_EXTRA_SASS "${m40_archs}" CACHE STRING
      "GPU architectures that get machine code compiled from the PTX of the first of CMAKE_CUDA_ARCHITECTURES")
endif()
set(M40_CUDA_EXTRA_SASS "" CACHE STRING
    "GPU architectures that get machine code compiled from the PTX of the first of CMAKE_CUDA_ARCHITECTURES")

set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# The M40 build carries no CUDA library but the runtime, linked statically.
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
enable_language(CUDA)
set(M40_HAVE_CUDA ON)
message(STATUS "m40-llm: CUDA backend with ${CMAKE_CUDA_COMPILER} "
               "(${CMAKE_CUDA_COMPILER_VERSION}) for architectures ${CMAKE_CUDA_ARCHITECTURES}")

# One PTX, machine code for many GPUs: nvcc runs its front end once for the
# virtual architecture and ptxas once per listed GPU.
if(M40_CUDA_EXTRA_SASS)
  list(GET CMAKE_CUDA_ARCHITECTURES 0 m40_ptx_arch)
  string(REGEX REPLACE "-(real|virtual)$" "" m40_ptx_arch "${m40_ptx_arch}")
  if(NOT m40_ptx_arch MATCHES "^[0-9]+$")
    message(FATAL_ERROR "M40_CUDA_EXTRA_SASS needs a numbered first CMAKE_CUDA_ARCHITECTURES entry "
                        "(found '${m40_ptx_arch}')")
  endif()
  set(m40_sass_codes "")
  foreach(a IN LISTS M40_CUDA_EXTRA_SASS)
    if(NOT a MATCHES "^[0-9]+$" OR a LESS m40_ptx_arch)
      message(FATAL_ERROR "M40_CUDA_EXTRA_SASS: '${a}' is not an architecture at or above ${m40_ptx_arch}")
    endif()
    list(APPEND m40_sass_codes "sm_${a}")
  endforeach()
  list(JOIN m40_sass_codes "$<COMMA>" m40_sass_codes)
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:CUDA>:--generate-code=arch=compute_${m40_ptx_arch}$<COMMA>code=[${m40_sass_codes}]>")
  message(STATUS "m40-llm: also machine code for ${M40_CUDA_EXTRA_SASS}, from compute_${m40_ptx_arch} PTX")
endif()
