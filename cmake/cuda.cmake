# Detect the CUDA toolkit and NCCL. hw/ builds its CUDA parts only when both are present;
# everything else builds without them.
set(MOESIM_HAVE_CUDA OFF)
if(NOT MOESIM_WITH_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)  # where the development machines have it
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib64 /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(MOESIM_HAVE_CUDA ON)
    endif()
  endif()
  if(MOESIM_HAVE_CUDA)
    # The kernels of hw/cuda_kernels.cu: A100 (sm_80) and H100/H200 (sm_90) unless told otherwise
    # (CUDA 13 no longer builds for V100's sm_70).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    enable_language(CUDA)
  endif()
  if(MOESIM_WITH_CUDA STREQUAL "ON" AND NOT MOESIM_HAVE_CUDA)
    message(FATAL_ERROR "MOESIM_WITH_CUDA=ON but the CUDA toolkit or NCCL was not found")
  endif()
endif()
message(STATUS "moesim: CUDA/NCCL backend ${MOESIM_HAVE_CUDA}")
