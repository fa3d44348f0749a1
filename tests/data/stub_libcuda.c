/* A stub libcuda for tests on machines without a GPU: see STUB_C in
 * tests/it/commands/load/cuda.rs for what it models; python/tests/test_cuda_stub.py builds it too. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef unsigned long long CUdeviceptr;
static int env_int(const char *k, int d) { const char *v = getenv(k); return v ? atoi(v) : d; }
static const char *text(int e) {
    switch (e) {
    case 1: return "stub: invalid argument";
    case 2: return "stub: out of memory";
    case 100: return "stub: no CUDA-capable device is detected";
    case 101: return "stub: invalid device ordinal";
    case 999: return "stub: unknown error";
    default: return "stub: error";
    }
}
static const char *name(int e) {
    switch (e) {
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return "CUDA_ERROR_STUB";
    }
}
int cuInit(unsigned int flags) { (void)flags; return env_int("STUB_CU_INIT", 100); }
int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
int cuDeviceGetCount(int *count) { *count = env_int("STUB_GPUS", 0); return 0; }
int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= env_int("STUB_GPUS", 0)) return 101;
    *dev = ordinal;
    return 0;
}
int cuDeviceGetName(char *out, int len, int dev) {
    (void)dev;
    strncpy(out, "Stub GPU", (size_t)len);
    return 0;
}
static int ctx_ok(void) { const char *v = getenv("STUB_CTX"); return v && !strcmp(v, "ok"); }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    (void)dev;
    if (!ctx_ok()) return 999;
    *ctx = (void *)0x1;
    return 0;
}
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
/* The calling thread's current context, as the driver keeps it. */
static __thread void *current;
int cuCtxSetCurrent(void *ctx) { current = ctx; return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }
int cuGetErrorString(int err, const char **s) { *s = text(err); return 0; }
int cuGetErrorName(int err, const char **s) { *s = name(err); return 0; }

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long mem_used;
int cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    long long cap = (long long)env_int("STUB_GPU_MEM", 0);
    pthread_mutex_lock(&mem_mu);
    if (cap > 0 && mem_used + n > (unsigned long long)cap) { pthread_mutex_unlock(&mem_mu); return 2; }
    mem_used += n;
    pthread_mutex_unlock(&mem_mu);
    void *m = malloc(n + 8);
    if (!m) return 2;
    *(size_t *)m = n;
    memset((char *)m + 8, 0xAB, n);
    *p = (CUdeviceptr)((char *)m + 8);
    return 0;
}
int cuMemFree_v2(CUdeviceptr p) {
    char *m = (char *)p - 8;
    pthread_mutex_lock(&mem_mu);
    mem_used -= *(size_t *)m;
    pthread_mutex_unlock(&mem_mu);
    free(m);
    return 0;
}
int cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { memset((void *)p, v, n); return 0; }
int cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
    (void)flags;
    if (posix_memalign(p, 4096, n)) return 2;
    memset(*p, 0xAB, n);
    return 0;
}
int cuMemFreeHost(void *p) { free(p); return 0; }

struct op { CUdeviceptr dst; const void *src; size_t n; };
struct stream { pthread_mutex_t mu; struct op *ops; size_t len, cap, done; };
struct event { struct stream *s; size_t at; };
int cuStreamCreate(struct stream **s, unsigned int flags) {
    (void)flags;
    *s = calloc(1, sizeof **s);
    pthread_mutex_init(&(*s)->mu, 0);
    return 0;
}
/* Runs the queued copies up to `upto` (the stream's lock held). */
static void run_until(struct stream *s, size_t upto) {
    while (s->done < upto) {
        struct op *o = &s->ops[s->done++];
        memcpy((void *)o->dst, o->src, o->n);
    }
}
/* The legacy default stream (handle 0), as the CUDA runtime and torch's default stream use it. */
static struct stream legacy = { PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0 };
static struct stream *real(struct stream *s) { return s ? s : &legacy; }
/* Not a driver call: how many copies were ever queued on stream `s` (tests ask whether the
 * caller's stream was the one used). */
size_t stub_stream_ops(struct stream *s) {
    s = real(s);
    pthread_mutex_lock(&s->mu);
    size_t n = s->len;
    pthread_mutex_unlock(&s->mu);
    return n;
}
int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, struct stream *s) {
    /* STUB_SLOW_MS: each copy takes that long to queue, one at a time per stream (as one copy
     * engine), so that a load lasts long enough to be interrupted however many threads feed it. */
    int slow = env_int("STUB_SLOW_MS", 0);
    s = real(s);
    pthread_mutex_lock(&s->mu);
    if (slow > 0) usleep((useconds_t)slow * 1000);
    if (s->len == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->ops = realloc(s->ops, s->cap * sizeof *s->ops);
    }
    s->ops[s->len].dst = dst; s->ops[s->len].src = src; s->ops[s->len].n = n;
    s->len++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}
int cuStreamSynchronize(struct stream *s) {
    s = real(s);
    pthread_mutex_lock(&s->mu);
    run_until(s, s->len);
    pthread_mutex_unlock(&s->mu);
    return 0;
}
int cuStreamDestroy_v2(struct stream *s) {
    cuStreamSynchronize(s);
    free(s->ops);
    free(s);
    return 0;
}
int cuEventCreate(struct event **e, unsigned int flags) { (void)flags; *e = calloc(1, sizeof **e); return 0; }
int cuEventRecord(struct event *e, struct stream *s) {
    s = real(s);
    pthread_mutex_lock(&s->mu);
    e->s = s; e->at = s->len;
    pthread_mutex_unlock(&s->mu);
    return 0;
}
int cuEventSynchronize(struct event *e) {
    if (!e->s) return 0;
    pthread_mutex_lock(&e->s->mu);
    run_until(e->s, e->at);
    pthread_mutex_unlock(&e->s->mu);
    return 0;
}
int cuEventElapsedTime(float *ms, struct event *a, struct event *b) {
    (void)a; (void)b;
    *ms = 0.001f;
    return 0;
}
int cuEventDestroy_v2(struct event *e) { free(e); return 0; }
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (const void *)src, n); return 0; }
/* Any address at or above 64 KiB is device memory of GPU STUB_PTR_ORDINAL (default 0); lower
 * ones are unknown to CUDA (CUDA_ERROR_INVALID_VALUE), as a wrong address would be. */
int cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    if (ptr < 0x10000) return 1;
    switch (attribute) {
    case 2: *(unsigned int *)data = 2; return 0;       /* MEMORY_TYPE: DEVICE */
    case 9: *(int *)data = env_int("STUB_PTR_ORDINAL", 0); return 0; /* DEVICE_ORDINAL */
    default: return 1;
    }
}
