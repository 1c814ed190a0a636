/* The CPU emulator's runtime (see cuda_emu.h): fibers with their own stacks, switched by a few lines of
 * x86-64 assembly at barriers; memory and stream calls done at once on the host. */
#include "backend/cuda/emu/cuda_emu.h"

#include <atomic>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define G4EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define G4EMU_ASAN 1
#endif
#endif
#ifdef G4EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator switches fibers with x86-64 assembly"
#endif

g4emu_thread *g4emu_cur;
uint3 g4emu_block_idx;
dim3 g4emu_block_dim, g4emu_grid_dim;

/* void g4emu_switch(void **save_sp, void *new_sp): saves the callee-saved registers on the current stack,
 * stores the stack pointer, loads the other one and restores its registers. */
extern "C" void g4emu_switch(void **save_sp, void *new_sp);
__asm__(".text\n"
        ".globl g4emu_switch\n"
        ".type g4emu_switch,@function\n"
        "g4emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size g4emu_switch, .-g4emu_switch\n");

enum { STACK_SIZE = 256 * 1024, MAX_THREADS = 1024 };

static struct {
    g4emu_thread threads[MAX_THREADS];
    int n;                        /* threads of the running block */
    int live;                     /* not yet done */
    void *main_sp;                /* the scheduler's stack */
    const std::function<void()> *body;
    /* block barrier */
    int block_arrived;
    unsigned long block_gen;
    /* warp barriers */
    int warp_arrived[MAX_THREADS / 32];
    int warp_live[MAX_THREADS / 32];
    unsigned long warp_gen[MAX_THREADS / 32];
    /* a warp's lanes' values, by the parity of the warp barrier's generation: a lane writes the next primitive's
     * values into the other half, and a third primitive, back in this half, needs every lane past the second
     * barrier, so all have read this one's (one barrier an exchange) */
    uint64_t warp_slot[2][MAX_THREADS];
    float warp_result[MAX_THREADS / 32];
    unsigned char *smem;
    size_t smem_cap;
    void *sched_fake_stack;
    const void *sched_stack_bottom;
    size_t sched_stack_size;
} E;

static void die(const char *what) {
    fprintf(stderr, "cuda emulator: %s (block %u,%u,%u thread %u,%u,%u)\n", what, g4emu_block_idx.x, g4emu_block_idx.y,
            g4emu_block_idx.z, g4emu_cur ? g4emu_cur->tid.x : 0, g4emu_cur ? g4emu_cur->tid.y : 0,
            g4emu_cur ? g4emu_cur->tid.z : 0);
    abort();
}

/* Switches from the running fiber back to the scheduler. */
static void yield_to_scheduler(void) {
    g4emu_thread *t = g4emu_cur;
#ifdef G4EMU_ASAN
    __sanitizer_start_switch_fiber(&t->fake_stack, E.sched_stack_bottom, E.sched_stack_size);
#endif
    g4emu_switch(&t->sp, E.main_sp);
#ifdef G4EMU_ASAN
    __sanitizer_finish_switch_fiber(t->fake_stack, NULL, NULL);
#endif
}

static void fiber_main(void) {
#ifdef G4EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &E.sched_stack_bottom, &E.sched_stack_size);
#endif
    (*E.body)();
    g4emu_thread *t = g4emu_cur;
    t->done = 1;
    E.live--;
    /* a finished thread no longer counts at barriers: release the ones it completes */
    if (E.block_arrived > 0 && E.block_arrived == E.live) {
        E.block_arrived = 0;
        E.block_gen++;
    }
    E.warp_live[t->warp]--;
    if (E.warp_arrived[t->warp] > 0 && E.warp_arrived[t->warp] == E.warp_live[t->warp]) {
        E.warp_arrived[t->warp] = 0;
        E.warp_gen[t->warp]++;
    }
#ifdef G4EMU_ASAN
    __sanitizer_start_switch_fiber(NULL, E.sched_stack_bottom, E.sched_stack_size);
#endif
    g4emu_switch(&t->sp, E.main_sp);
    die("a finished fiber was resumed");
}

static void fiber_start(g4emu_thread *t) {
    if (!t->stack) {
        t->stack_size = STACK_SIZE;
        t->stack = mmap(NULL, t->stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (t->stack == MAP_FAILED) die("cannot map a fiber stack");
    }
    uintptr_t top = ((uintptr_t)t->stack + t->stack_size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                              /* fiber_main's return address (never used) */
    *--sp = (uint64_t)(uintptr_t)fiber_main; /* popped by ret */
    for (int i = 0; i < 6; i++) *--sp = 0;  /* rbp rbx r12 r13 r14 r15 */
    unsigned int mx;
    unsigned short cw;
    __asm__ volatile("stmxcsr %0" : "=m"(mx));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    uint64_t ctl = (uint64_t)mx | ((uint64_t)cw << 32);
    *--sp = ctl;
    t->sp = sp;
    t->done = 0;
    t->waiting = 0;
}

void __syncthreads(void) {
    g4emu_thread *t = g4emu_cur;
    unsigned long gen = E.block_gen;
    if (++E.block_arrived == E.live) {
        E.block_arrived = 0;
        E.block_gen++;
        return;
    }
    t->waiting = 1;
    t->gen = gen;
    yield_to_scheduler();
}

static void warp_barrier(unsigned mask) {
    g4emu_thread *t = g4emu_cur;
    const int w = t->warp;
    /* every lane named in the mask must still run (shuffling with an exited lane is undefined) */
    int base = w * 32;
    if (E.warp_live[w] != 32) /* (32 live lanes: the warp is whole) */
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1u) && (base + l >= E.n || E.threads[base + l].done))
                die("warp primitive names a lane that has exited");
    unsigned long gen = E.warp_gen[w];
    if (++E.warp_arrived[w] == E.warp_live[w]) {
        E.warp_arrived[w] = 0;
        E.warp_gen[w]++;
        return;
    }
    t->waiting = 2;
    t->gen = gen;
    yield_to_scheduler();
}

void g4emu_warp_sync(unsigned mask) { warp_barrier(mask); }

uint64_t g4emu_warp_exchange(unsigned mask, uint64_t v, int src) {
    g4emu_thread *t = g4emu_cur;
    const int base = t->warp * 32;
    uint64_t *slot = E.warp_slot[E.warp_gen[t->warp] & 1];
    slot[base + t->lane] = v;
    warp_barrier(mask);
    if (!(mask >> src & 1u)) die("shuffle reads a lane outside its mask");
    return slot[base + src];
}

/* The lane that completes the barrier reduces the slots once; the result stays until that warp's next
 * reduction completes, which needs every lane, so each has read it by then. */
float g4emu_warp_reduce(float v, int op) {
    g4emu_thread *t = g4emu_cur;
    const int w = t->warp, base = w * 32;
    if (E.warp_live[w] != 32) die("warp reduction in a warp with exited or missing lanes");
    unsigned long gen = E.warp_gen[w];
    uint64_t *slot = E.warp_slot[gen & 1];
    memcpy(&slot[base + t->lane], &v, sizeof v);
    if (++E.warp_arrived[w] == E.warp_live[w]) {
        float r = 0.0f;
        for (int l = 0; l < 32; l++) {
            float x;
            memcpy(&x, &slot[base + l], sizeof x);
            r = l == 0 ? x : op ? fmaxf(r, x) : r + x;
        }
        E.warp_result[w] = r;
        E.warp_arrived[w] = 0;
        E.warp_gen[w]++;
        return r;
    }
    t->waiting = 2;
    t->gen = gen;
    yield_to_scheduler();
    return E.warp_result[w];
}

unsigned g4emu_warp_ballot(unsigned mask, int pred) {
    g4emu_thread *t = g4emu_cur;
    const int base = t->warp * 32;
    uint64_t *slot = E.warp_slot[E.warp_gen[t->warp] & 1];
    slot[base + t->lane] = (uint64_t)(pred != 0);
    warp_barrier(mask);
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && slot[base + l]) r |= 1u << l;
    return r;
}

void *g4emu_dyn_smem(void) { return E.smem; }

static void run_block(void) {
    E.live = E.n;
    E.block_arrived = 0;
    for (int w = 0; w < (E.n + 31) / 32; w++) {
        E.warp_arrived[w] = 0;
        E.warp_live[w] = E.n - w * 32 < 32 ? E.n - w * 32 : 32;
    }
    for (int i = 0; i < E.n; i++) fiber_start(&E.threads[i]);
    while (E.live > 0) {
        int progressed = 0;
        for (int i = 0; i < E.n; i++) {
            g4emu_thread *t = &E.threads[i];
            if (t->done) continue;
            if (t->waiting == 1 && t->gen == E.block_gen) continue;
            if (t->waiting == 2 && t->gen == E.warp_gen[t->warp]) continue;
            t->waiting = 0;
            g4emu_cur = t;
#ifdef G4EMU_ASAN
            __sanitizer_start_switch_fiber(&E.sched_fake_stack, t->stack, t->stack_size);
#endif
            g4emu_switch(&E.main_sp, t->sp);
#ifdef G4EMU_ASAN
            __sanitizer_finish_switch_fiber(E.sched_fake_stack, NULL, NULL);
#endif
            progressed = 1;
        }
        if (!progressed) die("deadlock: the block's threads wait at different barriers");
    }
    g4emu_cur = NULL;
}

void g4emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    const int n = (int)(block.x * block.y * block.z);
    if (n <= 0 || n > MAX_THREADS) die("bad block size");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) die("empty grid");
    if (smem > E.smem_cap) {
        free(E.smem);
        E.smem = (unsigned char *)malloc(smem);
        E.smem_cap = smem;
    }
    if (E.smem) memset(E.smem, 0xcd, E.smem_cap); /* poison: reads of unwritten shared memory give garbage */
    E.body = &body;
    E.n = n;
    g4emu_grid_dim = grid;
    g4emu_block_dim = block;
    for (int i = 0; i < n; i++) {
        g4emu_thread *t = &E.threads[i];
        t->tid.x = (unsigned)i % block.x;
        t->tid.y = ((unsigned)i / block.x) % block.y;
        t->tid.z = (unsigned)i / (block.x * block.y);
        t->warp = i / 32;
        t->lane = i % 32;
    }
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                g4emu_block_idx.x = x;
                g4emu_block_idx.y = y;
                g4emu_block_idx.z = z;
                run_block();
            }
}

/* ---------------------------------------------------------------- runtime */
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotSupported: return "not supported by the emulator";
    default: return "invalid value";
    }
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulator (CPU)");
    p->multiProcessorCount = 132; /* as an H200: the same grids and splits as there */
    p->totalGlobalMem = (size_t)8 << 30;
    p->l2CacheSize = 1 << 20;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->major = 9;
    p->minor = 0;
    return cudaSuccess;
}
/* Device memory: G4_EMU_MEMORY_MB of it (default 8 GiB), counted by what cudaMalloc handed out, so that free
 * memory falls as on a GPU and an allocation past it fails. */
static std::atomic<size_t> emu_allocated{0};
static size_t emu_memory(void) {
    const char *v = getenv("G4_EMU_MEMORY_MB");
    return v && atol(v) > 0 ? (size_t)atol(v) << 20 : (size_t)8 << 30;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    const size_t all = emu_memory(), used = emu_allocated.load();
    *f = used < all ? all - used : 0;
    *t = all;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = NULL;
    if (emu_allocated.load() + n > emu_memory()) return cudaErrorMemoryAllocation;
    *p = malloc(n ? n : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    emu_allocated += malloc_usable_size(*p);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (p) emu_allocated -= malloc_usable_size(p);
    free(p);
    return cudaSuccess;
}
/* pinned host memory is not device memory */
cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    if (n) memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) {
    return cudaMemcpy(d, s, n, k);
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, cudaMemcpyKind,
                              cudaStream_t) {
    for (size_t r = 0; r < h; r++) memcpy((char *)d + r * dp, (const char *)s + r * sp, w);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) {
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = NULL;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = NULL;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; } /* (launches run at once) */
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) {
    *ms = 0;
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaErrorNotSupported; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    *g = NULL;
    return cudaErrorNotSupported;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t, unsigned long long) {
    *e = NULL;
    return cudaErrorNotSupported;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
