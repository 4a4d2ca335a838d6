/* A fake Metal.framework in Objective-C for the GNU runtime (libobjc4): what MetalBridge drives, method by method
 * at Metal's exact C prototypes (METAL.md section 2), compiled for x86_64 or AArch64 into a shared library.
 *
 * MetalBridge loads it unmodified (its library paths point here and at the stand-in libobjc, objc_apple.c +
 * objc_msgSend_gnu_<arch>.S), so every message travels through the real runtime's dispatch and the platform's
 * calling convention: an MTLSize arrives by value on x86_64 and behind a pointer on AArch64 because the compiler
 * of this file says so, not because a test does.
 *
 * Every method call is one JSON line in the file named by FAKE_METAL_LOG: {"self": H, "sel": "...", "args": [...]}
 * with objects and pointers as integers, MTLSize as [w, h, d], NSRange as [location, length], BOOL as true/false.
 * A commit runs its command buffer at once, in order: each non-empty dispatch is sent to the kernel server named by
 * FAKE_METAL_KERNELS (a Unix socket; tests/native/kernel_server.py runs the kernel with the simulator's
 * KernelRunner on the buffers' real bytes and sends them back). A library's MSL is compiled by the same server; a
 * failure is an NSError through the out-parameter. Nothing is ever freed: a handle is never reused, so a log names
 * one object per handle.
 */
#include <objc/objc.h>
#include <objc/runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

typedef struct { uint64_t width, height, depth; } MTLSize;   /* Metal: NSUInteger x 3, 24 bytes */
typedef struct { uint64_t location, length; } NSRange;       /* Foundation: NSUInteger x 2, 16 bytes */
typedef unsigned long NSUInteger;

#define EXPORT __attribute__((visibility("default")))

EXPORT uint64_t fake_messages = 0;   /* method calls logged so far */
EXPORT uint64_t fake_kernels_run = 0;

/* ---- the log ------------------------------------------------------------------------------------------------ */

static FILE *logf_;
static char log_path[4096];

/* The log file FAKE_METAL_LOG names now (reopened when the variable changes: one process may run several
 * programs, each with its own log). */
static FILE *log_file(void) {
    const char *path = getenv("FAKE_METAL_LOG");
    if (path == NULL || !*path) path = "/dev/null";
    if (logf_ == NULL || strcmp(path, log_path) != 0) {
        if (logf_ != NULL) fclose(logf_);
        logf_ = fopen(path, "a");
        if (logf_ == NULL) { perror("fakemetal: FAKE_METAL_LOG"); abort(); }
        strncpy(log_path, path, sizeof log_path - 1);
    }
    return logf_;
}

/* A log line: fmt holds one conversion per argument: 'u' uint64, 'p' object or pointer, 'b' BOOL, 's' MTLSize*,
 * 'r' NSRange (two uint64). */
static void note(id self, SEL cmd, const char *fmt, ...) __attribute__((unused));
#include <stdarg.h>
static void note(id self, SEL cmd, const char *fmt, ...) {
    FILE *f = log_file();
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "{\"self\": %lu, \"sel\": \"%s\", \"args\": [", (unsigned long)(uintptr_t)self, sel_getName(cmd));
    for (const char *c = fmt; *c; c++) {
        if (c != fmt) fputs(", ", f);
        if (*c == 'u' || *c == 'p') {
            fprintf(f, "%lu", (unsigned long)va_arg(ap, uint64_t));
        } else if (*c == 'b') {
            fputs(va_arg(ap, int) ? "true" : "false", f);
        } else if (*c == 's') {
            const MTLSize *s = va_arg(ap, const MTLSize *);
            fprintf(f, "[%lu, %lu, %lu]", (unsigned long)s->width, (unsigned long)s->height, (unsigned long)s->depth);
        } else if (*c == 'r') {
            uint64_t loc = va_arg(ap, uint64_t), len = va_arg(ap, uint64_t);
            fprintf(f, "[%lu, %lu]", (unsigned long)loc, (unsigned long)len);
        }
    }
    va_end(ap);
    fputs("]}\n", f);
    fflush(f);
    fake_messages++;
}

#define U(x) ((uint64_t)(uintptr_t)(x))

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the kernel server ---------------------------------------------------------------------------------------
 * Request: u64 op (1 compile, 2 dispatch), then
 *   compile:  u64 n, n bytes of MSL
 *   dispatch: u64 n, MSL; u64 n, function name; u64 grid[3], threadgroup[3]; u64 nbuffers, per buffer u64 id,
 *             u64 length, the bytes; u64 nbindings, per binding u64 index, u64 buffer number (in this request),
 *             u64 offset
 * Answer: u64 status (0: done), u64 n, n bytes of text (the error when status != 0); after a dispatch that was
 * done, every buffer's bytes again, in request order. */

static int server_fd = -1;

static int server(void) {
    if (server_fd >= 0) return server_fd;
    const char *path = getenv("FAKE_METAL_KERNELS");
    if (path == NULL || !*path) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        perror("fakemetal: connecting to FAKE_METAL_KERNELS");
        if (fd >= 0) close(fd);
        return -1;
    }
    return server_fd = fd;
}

static int put(const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = write(server_fd, c, n);
        if (k <= 0) return -1;
        c += k; n -= (size_t)k;
    }
    return 0;
}

static int get(void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t k = read(server_fd, c, n);
        if (k <= 0) return -1;
        c += k; n -= (size_t)k;
    }
    return 0;
}

static int put64(uint64_t v) { return put(&v, 8); }
static int putstr(const char *s) { uint64_t n = strlen(s); return put64(n) || put(s, n); }

/* The answer's status and text (malloc'd, NUL-terminated); a broken connection is status 99. */
static uint64_t answer(char **text) {
    uint64_t status, n;
    if (get(&status, 8) || get(&n, 8)) { *text = strdup("the kernel server closed the connection"); return 99; }
    *text = malloc(n + 1);
    if (get(*text, n)) { (*text)[0] = 0; return 99; }
    (*text)[n] = 0;
    return status;
}

/* ---- the root class ------------------------------------------------------------------------------------------ */

@interface FakeObject
{
    Class isa;
    uint64_t refs;
}
+ (id)alloc;
+ (id)new;
- (id)init;
@end

@implementation FakeObject
+ (id)alloc { id o = class_createInstance(self, 0); note(self, _cmd, ""); ((FakeObject *)o)->refs = 1; return o; }
+ (id)new { id o = class_createInstance(self, 0); note(self, _cmd, ""); ((FakeObject *)o)->refs = 1; return o; }
+ (id)make { id o = class_createInstance(self, 0); ((FakeObject *)o)->refs = 1; return o; }
- (id)init { note(self, _cmd, ""); return self; }
- (id)retain { note(self, _cmd, ""); refs++; return self; }
- (void)release { note(self, _cmd, ""); refs--; }
- (void)setLabel:(id)label { note(self, _cmd, "p", U(label)); }
@end

@interface NSString : FakeObject
{
@public
    char *utf8;
}
@end

@implementation NSString
+ (id)withC:(const char *)s { NSString *o = [self make]; o->utf8 = strdup(s); return o; }
+ (id)stringWithUTF8String:(const char *)s { note(self, _cmd, "p", U(s)); return [self withC: s]; }
- (const char *)UTF8String { note(self, _cmd, ""); return utf8; }
@end

@interface NSError : FakeObject
{
@public
    int64_t code_;
    NSString *text;
}
@end

@implementation NSError
+ (id)code:(int64_t)c text:(const char *)t { NSError *e = [self make]; e->code_ = c; e->text = [NSString withC: t]; return e; }
- (int64_t)code { note(self, _cmd, ""); return code_; }
- (id)localizedDescription { note(self, _cmd, ""); return text; }
@end

/* ---- resources ---------------------------------------------------------------------------------------------- */

@interface FakeBuffer : FakeObject
{
@public
    NSUInteger length_;
    unsigned char *bytes;
}
@end

@implementation FakeBuffer
- (void *)contents { note(self, _cmd, ""); return bytes; }
- (NSUInteger)length { note(self, _cmd, ""); return length_; }
- (uint64_t)gpuAddress { note(self, _cmd, ""); return U(bytes); }
@end

@interface FakeLibrary : FakeObject
{
@public
    NSString *source;
}
@end

@interface FakeFunction : FakeObject
{
@public
    NSString *source;
    NSString *name;
}
@end

@implementation FakeFunction
@end

@implementation FakeLibrary
- (id)newFunctionWithName:(id)name {
    note(self, _cmd, "p", U(name));
    FakeFunction *f = [FakeFunction make];
    f->source = source;
    f->name = [NSString withC: ((NSString *)name)->utf8];
    return f;
}
@end

@interface MTLComputePipelineDescriptor : FakeObject
{
@public
    FakeFunction *function;
    BOOL icb;
}
@end

@implementation MTLComputePipelineDescriptor
- (void)setComputeFunction:(id)f { note(self, _cmd, "p", U(f)); function = f; }
- (void)setSupportIndirectCommandBuffers:(BOOL)flag { note(self, _cmd, "b", (int)flag); icb = flag; }
@end

@interface FakePipeline : FakeObject
{
@public
    FakeFunction *function;
}
@end

@implementation FakePipeline
- (NSUInteger)maxTotalThreadsPerThreadgroup { note(self, _cmd, ""); return 1024; }
@end

@interface FakeEvent : FakeObject
{
@public
    uint64_t value;
}
@end

@implementation FakeEvent
- (uint64_t)signaledValue { note(self, _cmd, ""); return value; }
- (BOOL)waitUntilSignaledValue:(uint64_t)v timeoutMS:(uint64_t)ms {
    note(self, _cmd, "uu", v, ms);
    return value >= v;  /* commits run at once: nothing can signal while this waits */
}
@end

@interface FakeFence : FakeObject
@end
@implementation FakeFence
@end

@interface MTLResidencySetDescriptor : FakeObject
@end
@implementation MTLResidencySetDescriptor
@end

@interface FakeResidencySet : FakeObject
@end
@implementation FakeResidencySet
- (void)addAllocation:(id)a { note(self, _cmd, "p", U(a)); }
- (void)removeAllocation:(id)a { note(self, _cmd, "p", U(a)); }
- (void)commit { note(self, _cmd, ""); }
@end

/* ---- indirect command buffers --------------------------------------------------------------------------------- */

#define MAX_BIND 31

typedef struct {
    FakePipeline *pipeline;
    FakeBuffer *buffers[MAX_BIND];
    uint64_t offsets[MAX_BIND];
    /* setBytes: a private copy (NULL when the slot holds a buffer) */
    unsigned char *bytes[MAX_BIND];
    uint64_t nbytes[MAX_BIND];
    MTLSize grid, group;
} Binding;

@interface MTLIndirectCommandBufferDescriptor : FakeObject
@end
@implementation MTLIndirectCommandBufferDescriptor
- (void)setCommandTypes:(NSUInteger)t { note(self, _cmd, "u", (uint64_t)t); }
- (void)setInheritBuffers:(BOOL)b { note(self, _cmd, "b", (int)b); }
- (void)setInheritPipelineState:(BOOL)b { note(self, _cmd, "b", (int)b); }
- (void)setMaxKernelBufferBindCount:(NSUInteger)n { note(self, _cmd, "u", (uint64_t)n); }
@end

@interface FakeICBCommand : FakeObject
{
@public
    Binding state;
}
@end

@implementation FakeICBCommand
- (void)setComputePipelineState:(id)p { note(self, _cmd, "p", U(p)); state.pipeline = p; }
- (void)setKernelBuffer:(id)b offset:(NSUInteger)off atIndex:(NSUInteger)i {
    note(self, _cmd, "puu", U(b), (uint64_t)off, (uint64_t)i);
    if (i < MAX_BIND) { state.buffers[i] = b; state.offsets[i] = off; }
}
- (void)concurrentDispatchThreadgroups:(MTLSize)grid threadsPerThreadgroup:(MTLSize)group {
    note(self, _cmd, "ss", &grid, &group);
    state.grid = grid; state.group = group;
}
- (void)setBarrier { note(self, _cmd, ""); }
@end

@interface FakeICB : FakeObject
{
@public
    NSUInteger count;
    FakeICBCommand **commands;
}
@end

@implementation FakeICB
- (id)indirectComputeCommandAtIndex:(NSUInteger)i {
    note(self, _cmd, "u", (uint64_t)i);
    if (i >= count) return nil;
    if (commands[i] == nil) commands[i] = [FakeICBCommand make];
    return commands[i];
}
@end

/* ---- command buffers ---------------------------------------------------------------------------------------- */

enum { STEP_DISPATCH, STEP_EXECUTE, STEP_SIGNAL, STEP_WAIT };

typedef struct {
    int kind;
    Binding b;              /* STEP_DISPATCH: the encoder's state at the dispatch */
    FakeICB *icb;           /* STEP_EXECUTE */
    NSRange range;
    FakeEvent *event;       /* STEP_SIGNAL / STEP_WAIT */
    uint64_t value;
} Step;

@interface FakeCommandBuffer : FakeObject
{
@public
    Step *steps;
    size_t nsteps, cap, at;   /* steps encoded; the next step to run */
    uint64_t status_;
    NSError *error_;
    double start, end;
}
- (Step *)add:(int)kind;
- (int)run;
@end

@interface FakeEncoder : FakeObject
{
@public
    FakeCommandBuffer *cb;
    Binding state;
}
@end

@implementation FakeEncoder
- (void)waitForFence:(id)f { note(self, _cmd, "p", U(f)); }
- (void)updateFence:(id)f { note(self, _cmd, "p", U(f)); }
- (void)useResources:(const id *)rs count:(NSUInteger)n usage:(NSUInteger)usage {
    note(self, _cmd, "puu", U(rs), (uint64_t)n, (uint64_t)usage);
}
- (void)setComputePipelineState:(id)p { note(self, _cmd, "p", U(p)); state.pipeline = p; }
- (void)setBuffer:(id)b offset:(NSUInteger)off atIndex:(NSUInteger)i {
    note(self, _cmd, "puu", U(b), (uint64_t)off, (uint64_t)i);
    if (i < MAX_BIND) { state.buffers[i] = b; state.offsets[i] = off; state.bytes[i] = NULL; }
}
- (void)setBytes:(const void *)p length:(NSUInteger)n atIndex:(NSUInteger)i {
    note(self, _cmd, "puu", U(p), (uint64_t)n, (uint64_t)i);
    if (i < MAX_BIND) {
        state.buffers[i] = nil; state.offsets[i] = 0;
        state.bytes[i] = malloc(n ? n : 1); memcpy(state.bytes[i], p, n); state.nbytes[i] = n;
    }
}
- (void)dispatchThreadgroups:(MTLSize)grid threadsPerThreadgroup:(MTLSize)group {
    note(self, _cmd, "ss", &grid, &group);
    Step *s = [cb add: STEP_DISPATCH];
    s->b = state; s->b.grid = grid; s->b.group = group;
}
- (void)executeCommandsInBuffer:(id)icb withRange:(NSRange)r {
    note(self, _cmd, "pr", U(icb), r.location, r.length);
    Step *s = [cb add: STEP_EXECUTE];
    s->icb = icb; s->range = r;
}
- (void)endEncoding { note(self, _cmd, ""); }
@end

/* Run one dispatch through the kernel server; NULL when done, else the error text (malloc'd). */
static char *run_dispatch(const Binding *b) {
    if (b->pipeline == nil) return strdup("dispatch without a compute pipeline state");
    uint64_t threads = b->grid.width * b->grid.height * b->grid.depth * b->group.width * b->group.height *
                       b->group.depth;
    if (threads == 0) return NULL;  /* an empty dispatch runs nothing */
    if (server() < 0) return strdup("no kernel server (FAKE_METAL_KERNELS)");
    FakeFunction *f = b->pipeline->function;
    /* distinct storages: each buffer once, each setBytes copy once */
    const void *keys[MAX_BIND]; unsigned char *data[MAX_BIND]; uint64_t lens[MAX_BIND], ids[MAX_BIND];
    int slot[MAX_BIND]; int nbuf = 0, nbind = 0;
    for (int i = 0; i < MAX_BIND; i++) {
        slot[i] = -1;
        const void *key = b->buffers[i] ? (const void *)b->buffers[i] : (const void *)b->bytes[i];
        if (key == NULL) continue;
        nbind++;
        for (int k = 0; k < nbuf; k++) if (keys[k] == key) slot[i] = k;
        if (slot[i] >= 0) continue;
        keys[nbuf] = key;
        data[nbuf] = b->buffers[i] ? b->buffers[i]->bytes : b->bytes[i];
        lens[nbuf] = b->buffers[i] ? b->buffers[i]->length_ : b->nbytes[i];
        ids[nbuf] = U(key);
        slot[i] = nbuf++;
    }
    if (put64(2) || putstr(f->source->utf8) || putstr(f->name->utf8) || put64(b->grid.width) ||
        put64(b->grid.height) || put64(b->grid.depth) || put64(b->group.width) || put64(b->group.height) ||
        put64(b->group.depth) || put64((uint64_t)nbuf))
        return strdup("the kernel server closed the connection");
    for (int k = 0; k < nbuf; k++)
        if (put64(ids[k]) || put64(lens[k]) || put(data[k], lens[k])) return strdup("kernel server: write failed");
    if (put64((uint64_t)nbind)) return strdup("kernel server: write failed");
    for (int i = 0; i < MAX_BIND; i++)
        if (slot[i] >= 0 && (put64((uint64_t)i) || put64((uint64_t)slot[i]) || put64(b->offsets[i])))
            return strdup("kernel server: write failed");
    char *text;
    if (answer(&text) != 0) return text;
    free(text);
    for (int k = 0; k < nbuf; k++)
        if (get(data[k], lens[k])) return strdup("kernel server: read failed");
    fake_kernels_run++;
    return NULL;
}

static int pending_n;
static FakeCommandBuffer *pending[4096];

@implementation FakeCommandBuffer
- (Step *)add:(int)kind {
    if (nsteps == cap) { cap = cap ? 2 * cap : 16; steps = realloc(steps, cap * sizeof *steps); }
    Step *s = &steps[nsteps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    return s;
}
- (id)computeCommandEncoder {
    note(self, _cmd, "");
    FakeEncoder *e = [FakeEncoder make];
    e->cb = self;
    return e;
}
- (void)encodeSignalEvent:(id)ev value:(uint64_t)v {
    note(self, _cmd, "pu", U(ev), v);
    Step *s = [self add: STEP_SIGNAL]; s->event = ev; s->value = v;
}
- (void)encodeWaitForEvent:(id)ev value:(uint64_t)v {
    note(self, _cmd, "pu", U(ev), v);
    Step *s = [self add: STEP_WAIT]; s->event = ev; s->value = v;
}
- (void)addResidencySet:(id)r { note(self, _cmd, "p", U(r)); }
/* Run the steps from `at` on, in order; 0 when a wait is not satisfied yet (the buffer stays pending). */
- (int)run {
    for (; at < nsteps; at++) {
        Step *s = &steps[at];
        char *err = NULL;
        if (s->kind == STEP_WAIT) {
            if (s->event->value < s->value) return 0;
        } else if (s->kind == STEP_SIGNAL) {
            if (s->event->value < s->value) s->event->value = s->value;
        } else if (s->kind == STEP_DISPATCH) {
            err = run_dispatch(&s->b);
        } else {
            FakeICB *icb = s->icb;
            for (uint64_t i = s->range.location; !err && i < s->range.location + s->range.length; i++) {
                if (i >= icb->count || icb->commands[i] == nil) continue;
                err = run_dispatch(&icb->commands[i]->state);
            }
        }
        if (err) {
            error_ = [NSError code: 1 text: err];  /* MTLCommandBufferErrorInternal */
            free(err);
            status_ = 5;  /* MTLCommandBufferStatusError */
            at = nsteps;
            end = now_s();
            return 1;
        }
    }
    status_ = 4;  /* MTLCommandBufferStatusCompleted */
    end = now_s();
    return 1;
}
- (void)commit {
    note(self, _cmd, "");
    status_ = 2;  /* Committed; Scheduled and Completed follow */
    start = now_s();
    pending[pending_n++] = self;
    /* run whatever can run, until nothing moves (a wait on a later commit's signal stays pending) */
    for (int moved = 1; moved;) {
        moved = 0;
        for (int i = 0; i < pending_n; i++) {
            if ([pending[i] run]) {
                pending[i] = pending[--pending_n];
                moved = 1;
                break;
            }
        }
    }
}
- (void)waitUntilCompleted { note(self, _cmd, ""); }
- (NSUInteger)status { note(self, _cmd, ""); return status_; }
- (id)error { note(self, _cmd, ""); return error_; }
- (double)GPUStartTime { note(self, _cmd, ""); return status_ >= 4 ? start : 0.0; }
- (double)GPUEndTime { note(self, _cmd, ""); return status_ >= 4 ? end : 0.0; }
@end

@interface FakeQueue : FakeObject
@end
@implementation FakeQueue
- (id)commandBuffer { note(self, _cmd, ""); return [FakeCommandBuffer make]; }
- (void)addResidencySet:(id)r { note(self, _cmd, "p", U(r)); }
@end

/* ---- the device ---------------------------------------------------------------------------------------------- */

@interface FakeDevice : FakeObject
@end

@implementation FakeDevice
- (id)newCommandQueueWithMaxCommandBufferCount:(NSUInteger)n { note(self, _cmd, "u", (uint64_t)n); return [FakeQueue make]; }
- (id)newSharedEvent { note(self, _cmd, ""); return [FakeEvent make]; }
- (NSUInteger)maxBufferLength { note(self, _cmd, ""); return (NSUInteger)1 << 32; }
- (id)newFence { note(self, _cmd, ""); return [FakeFence make]; }
- (id)newBufferWithLength:(NSUInteger)n options:(NSUInteger)opts {
    note(self, _cmd, "uu", (uint64_t)n, (uint64_t)opts);
    FakeBuffer *b = [FakeBuffer make];
    b->length_ = n;
    b->bytes = calloc(1, n ? n : 1);
    return b;
}
- (id)newLibraryWithSource:(id)src options:(id)opts error:(id *)err {
    note(self, _cmd, "ppp", U(src), U(opts), U(err));
    const char *msl = ((NSString *)src)->utf8;
    char *text = NULL;
    uint64_t status = 98;
    if (server() < 0) text = strdup("no kernel server (FAKE_METAL_KERNELS)");
    else if (put64(1) || putstr(msl)) text = strdup("the kernel server closed the connection");
    else status = answer(&text);
    if (status != 0) {
        if (err) *err = [NSError code: 3 text: text];  /* MTLLibraryErrorCompileFailure */
        free(text);
        return nil;
    }
    free(text);
    FakeLibrary *lib = [FakeLibrary make];
    lib->source = [NSString withC: msl];
    return lib;
}
- (id)newComputePipelineStateWithDescriptor:(id)desc options:(NSUInteger)opts reflection:(void *)refl
                                      error:(id *)err {
    note(self, _cmd, "pupp", U(desc), (uint64_t)opts, U(refl), U(err));
    FakeFunction *f = ((MTLComputePipelineDescriptor *)desc)->function;
    if (f == nil) {
        if (err) *err = [NSError code: 1 text: "the descriptor has no compute function"];
        return nil;
    }
    FakePipeline *p = [FakePipeline make];
    p->function = f;
    return p;
}
- (id)newIndirectCommandBufferWithDescriptor:(id)desc maxCommandCount:(NSUInteger)n options:(NSUInteger)opts {
    note(self, _cmd, "puu", U(desc), (uint64_t)n, (uint64_t)opts);
    if (getenv("FAKE_METAL_NO_ICB")) return nil;
    FakeICB *icb = [FakeICB make];
    icb->count = n;
    icb->commands = calloc(n ? n : 1, sizeof *icb->commands);
    return icb;
}
- (id)newResidencySetWithDescriptor:(id)desc error:(id *)err {
    note(self, _cmd, "pp", U(desc), U(err));
    if (getenv("FAKE_METAL_NO_RESIDENCY_SETS")) {
        if (err) *err = [NSError code: 1 text: "residency sets are off (FAKE_METAL_NO_RESIDENCY_SETS)"];
        return nil;
    }
    return [FakeResidencySet make];
}
@end

/* A message no method answers: Metal would raise "unrecognized selector"; here it is an abort that names it (GNU's
 * forwarding would otherwise run off into __builtin_apply). */
static void unrecognized(id self, SEL cmd) {
    fprintf(stderr, "fakemetal: unrecognized selector -[%s %s]\n", object_getClassName(self), sel_getName(cmd));
    fflush(NULL);
    abort();
}

static IMP forward(id self, SEL cmd) { (void)self; (void)cmd; return (IMP)unrecognized; }

extern IMP (*__objc_msg_forward2)(id, SEL);

__attribute__((constructor)) static void install_forward(void) { __objc_msg_forward2 = forward; }

EXPORT id MTLCreateSystemDefaultDevice(void) {
    static id device;
    if (device == nil) device = [FakeDevice make];
    return device;
}
