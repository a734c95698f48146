// Stand-in for CUDA's cuda_fp16.h in the host build of the kernels (tests/host_cuda): __half
// and its conversions come from cuda_host.h, which the build force-includes.
#include "../cuda_host.h"
