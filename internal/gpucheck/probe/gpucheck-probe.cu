// gpucheck-probe runs inside the suite's containers. It reports what the
// container sees, one "gpucheck: key=value" line per fact, and leaves the
// verdict to the suite (internal/gpucheck/probe.go parses the lines):
//
//   env.<NAME>=<value>   NVIDIA/CUDA variables the container got
//   devnode=<path>       every /dev/nvidia* node in the container
//   cuda=fail:<error>    CUDA could not enumerate devices
//   devices=<n>          cudaGetDeviceCount
//   uuid.<i>=GPU-...     device i's UUID
//   mem.<i>=<bytes>      device i's memory (cudaDeviceProp.totalGlobalMem;
//                        a MIG device's is its instance's)
//   kernel=ok|fail:<e>   a vector add on device 0, checked on the host side
//   alloc=ok|fail:<e>    with --alloc-mib N: cudaMalloc of N MiB + memset
//
// Options: --set-env NAME=VALUE (before CUDA starts, as a container that
// rewrites its environment would), --alloc-mib N.
//
// Build: nvcc -O2 -o gpucheck-probe gpucheck-probe.cu
#include <cuda_runtime.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__global__ void add(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

static void report_env(void) {
  const char *names[] = {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY",
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    const char *v = getenv(names[i]);
    if (v) printf("gpucheck: env.%s=%s\n", names[i], v);
  }
}

static void report_devnodes(void) {
  DIR *d = opendir("/dev");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "nvidia", 6) == 0) printf("gpucheck: devnode=/dev/%s\n", e->d_name);
  }
  closedir(d);
  // A MIG device's capability nodes (nvidia-cap<minor>).
  if (!(d = opendir("/dev/nvidia-caps"))) return;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "nvidia-cap", 10) == 0) printf("gpucheck: devnode=/dev/nvidia-caps/%s\n", e->d_name);
  }
  closedir(d);
}

static void print_uuid(int i, const cudaUUID_t *u) {
  const unsigned char *b = (const unsigned char *)u->bytes;
  printf("gpucheck: uuid.%d=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", i,
         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

// Single-line error text, so that the report stays one line per fact.
#define FAIL(key, err) printf("gpucheck: %s=fail:%s\n", key, cudaGetErrorString(err))

static int run_kernel(void) {
  const int n = 1 << 20;
  size_t bytes = n * sizeof(float);
  float *ha = (float *)malloc(bytes), *hc = (float *)malloc(bytes);
  float *da, *db, *dc;
  cudaError_t err;
  for (int i = 0; i < n; i++) ha[i] = (float)i;
  if ((err = cudaMalloc(&da, bytes)) != cudaSuccess || (err = cudaMalloc(&db, bytes)) != cudaSuccess ||
      (err = cudaMalloc(&dc, bytes)) != cudaSuccess) {
    FAIL("kernel", err);
    return 0;
  }
  cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(db, ha, bytes, cudaMemcpyHostToDevice);
  add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  if ((err = cudaGetLastError()) != cudaSuccess || (err = cudaDeviceSynchronize()) != cudaSuccess ||
      (err = cudaMemcpy(hc, dc, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    FAIL("kernel", err);
    return 0;
  }
  for (int i = 0; i < n; i++) {
    if (hc[i] != 2.0f * (float)i) {
      printf("gpucheck: kernel=fail:wrong result at %d: %f\n", i, hc[i]);
      return 0;
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  free(ha);
  free(hc);
  printf("gpucheck: kernel=ok\n");
  return 1;
}

static void try_alloc(long mib) {
  void *p = NULL;
  cudaError_t err = cudaMalloc(&p, (size_t)mib << 20);
  if (err == cudaSuccess) err = cudaMemset(p, 1, (size_t)mib << 20);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    FAIL("alloc", err);
    return;
  }
  cudaFree(p);
  printf("gpucheck: alloc=ok\n");
}

int main(int argc, char **argv) {
  long alloc_mib = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--set-env") == 0 && i + 1 < argc) {
      char *kv = strdup(argv[++i]);
      char *eq = strchr(kv, '=');
      if (!eq) {
        fprintf(stderr, "--set-env %s: want NAME=VALUE\n", kv);
        return 2;
      }
      *eq = 0;
      setenv(kv, eq + 1, 1);
    } else if (strcmp(argv[i], "--alloc-mib") == 0 && i + 1 < argc) {
      alloc_mib = strtol(argv[++i], NULL, 10);
    } else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  report_env();
  report_devnodes();
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    FAIL("cuda", err);
    return 0;
  }
  printf("gpucheck: devices=%d\n", n);
  for (int i = 0; i < n; i++) {
    cudaDeviceProp p;
    if ((err = cudaGetDeviceProperties(&p, i)) != cudaSuccess) {
      FAIL("cuda", err);
      return 0;
    }
    print_uuid(i, &p.uuid);
    printf("gpucheck: mem.%d=%zu\n", i, p.totalGlobalMem);
  }
  if (n > 0 && run_kernel() && alloc_mib > 0) try_alloc(alloc_mib);
  return 0;
}
