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
//   sms=<n>              device 0's multiprocessor count as CUDA reports it
//   spin=ok|fail:<e>     with --spin-reps R: spin_fma ran R times and its
//                        result matches the host's
//   spin.ms=<t1>,...     each repetition's time, CUDA events around the launch
//   spin.start=<ms>      wall clock (CLOCK_REALTIME, ms since the epoch) when
//   spin.end=<ms>        the first repetition started and the last ended
//   spin.late=<ms>       how late the first repetition started after --start-at
//
// Options: --set-env NAME=VALUE (before CUDA starts, as a container that
// rewrites its environment would), --alloc-mib N, and the fixed work of the
// throughput checks: --spin-reps R --spin-blocks B --spin-iters N [--start-at MS].
// spin_fma is compute-bound: B blocks of 256 threads, each thread N
// iterations of four independent fmaf chains (8 N flops), no memory traffic
// but one store per thread; so its time is set by how many SMs run its
// blocks. CUDA and the kernel are warmed up first; with --start-at the
// repetitions start at that wall-clock time, so that the containers of one
// check start their kernels together.
//
// Build: nvcc -O2 -o gpucheck-probe gpucheck-probe.cu
#include <cuda_runtime.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__global__ void add(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// Single-line error text, so that the report stays one line per fact.
#define FAIL(key, err) printf("gpucheck: %s=fail:%s\n", key, cudaGetErrorString(err))

#define SPIN_THREADS 256

// spin_fma: the probe's compute-bound kernel of fixed work (see above).
// The start values scale by a power of two, an exact product, so that the
// compiler's fusing of multiply and add cannot make the GPU's result
// differ from spin_expected's.
__global__ void spin_fma(float *out, int iters) {
  float a = 1.0f + threadIdx.x * 0x1p-20f, b = a + 0.5f, c = a + 0.25f, d = a + 0.125f;
  for (int i = 0; i < iters; i++) {
    a = fmaf(a, 0.999999f, 1e-6f);
    b = fmaf(b, 0.999998f, 2e-6f);
    c = fmaf(c, 0.999997f, 3e-6f);
    d = fmaf(d, 0.999996f, 4e-6f);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}

// spin_expected is what spin_fma stores for thread t (fmaf rounds once, on
// the host as on the GPU).
static float spin_expected(int t, int iters) {
  float a = 1.0f + t * 0x1p-20f, b = a + 0.5f, c = a + 0.25f, d = a + 0.125f;
  for (int i = 0; i < iters; i++) {
    a = fmaf(a, 0.999999f, 1e-6f);
    b = fmaf(b, 0.999998f, 2e-6f);
    c = fmaf(c, 0.999997f, 3e-6f);
    d = fmaf(d, 0.999996f, 4e-6f);
  }
  return a + b + c + d;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_until_ms(double t) {
  for (double left = t - now_ms(); left > 0; left = t - now_ms()) {
    struct timespec ts = {(time_t)(left / 1e3), (long)((left - (time_t)(left / 1e3) * 1e3) * 1e6)};
    nanosleep(&ts, NULL);
  }
}

static void run_spin(int reps, int blocks, int iters, double start_at) {
  float *out, host[2];
  size_t n = (size_t)blocks * SPIN_THREADS;
  cudaError_t err;
  cudaEvent_t t0, t1;
  if ((err = cudaMalloc(&out, n * sizeof(float))) != cudaSuccess || (err = cudaEventCreate(&t0)) != cudaSuccess ||
      (err = cudaEventCreate(&t1)) != cudaSuccess) {
    FAIL("spin", err);
    return;
  }
  // Warm-up: module load and first launch stay out of the timed part.
  spin_fma<<<blocks, SPIN_THREADS>>>(out, 1);
  if ((err = cudaDeviceSynchronize()) != cudaSuccess) {
    FAIL("spin", err);
    return;
  }
  if (start_at > 0) sleep_until_ms(start_at);
  double start = now_ms();
  printf("gpucheck: spin.start=%.3f\n", start);
  if (start_at > 0) printf("gpucheck: spin.late=%.3f\n", start - start_at);
  char list[4096] = "";
  for (int r = 0; r < reps; r++) {
    float ms = 0;
    cudaEventRecord(t0);
    spin_fma<<<blocks, SPIN_THREADS>>>(out, iters);
    cudaEventRecord(t1);
    if ((err = cudaEventSynchronize(t1)) != cudaSuccess || (err = cudaGetLastError()) != cudaSuccess ||
        (err = cudaEventElapsedTime(&ms, t0, t1)) != cudaSuccess) {
      FAIL("spin", err);
      return;
    }
    size_t l = strlen(list);
    snprintf(list + l, sizeof(list) - l, "%s%.3f", r ? "," : "", ms);
  }
  printf("gpucheck: spin.end=%.3f\n", now_ms());
  printf("gpucheck: spin.ms=%s\n", list);
  if ((err = cudaMemcpy(&host[0], out, sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess ||
      (err = cudaMemcpy(&host[1], out + n - 1, sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess) {
    FAIL("spin", err);
    return;
  }
  float want0 = spin_expected(0, iters), want1 = spin_expected(SPIN_THREADS - 1, iters);
  if (host[0] != want0 || host[1] != want1) {
    printf("gpucheck: spin=fail:wrong result %.9g %.9g, want %.9g %.9g\n", host[0], host[1], want0, want1);
    return;
  }
  cudaFree(out);
  printf("gpucheck: spin=ok\n");
}

static void report_env(void) {
  const char *names[] = {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY",
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                         "CUDA_MPS_CLIENT_PRIORITY"};
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
    // A refused allocation is no sticky error, but it stays CUDA's last
    // error, which the timed kernel's check would report as its own.
    cudaGetLastError();
    return;
  }
  cudaFree(p);
  printf("gpucheck: alloc=ok\n");
}

int main(int argc, char **argv) {
  long alloc_mib = 0;
  int spin_reps = 0, spin_blocks = 0, spin_iters = 0;
  double start_at = 0;
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
    } else if (strcmp(argv[i], "--spin-reps") == 0 && i + 1 < argc) {
      spin_reps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--spin-blocks") == 0 && i + 1 < argc) {
      spin_blocks = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--spin-iters") == 0 && i + 1 < argc) {
      spin_iters = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--start-at") == 0 && i + 1 < argc) {
      start_at = strtod(argv[++i], NULL);
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
    if (i == 0) printf("gpucheck: sms=%d\n", p.multiProcessorCount);
  }
  if (n > 0 && run_kernel()) {
    if (alloc_mib > 0) try_alloc(alloc_mib);
    if (spin_reps > 0) {
      if (spin_blocks < 1 || spin_iters < 1 || spin_reps > 100) {
        fprintf(stderr, "--spin-reps 1..100 needs --spin-blocks and --spin-iters of at least 1\n");
        return 2;
      }
      run_spin(spin_reps, spin_blocks, spin_iters, start_at);
    }
  }
  return 0;
}
