/* A stand-in for libobjc and Metal.framework, for the MetalBridge marshalling tests (x86_64 only).
 *
 * It exports what MetalBridge loads from the real libraries -- objc_msgSend (objc_msgSend_x86_64.S),
 * sel_registerName, objc_getClass, objc_autoreleasePoolPush/Pop, MTLCreateSystemDefaultDevice -- and a handful of
 * objects whose methods have the exact C prototypes of real Metal selectors (METAL.md section 2). Each method
 * records what it received into the global `fake_last`, which the tests read back with ctypes.
 *
 * Objects are laid out like Objective-C's: the first word of every object is its class (isa); a class object's isa
 * is its metaclass, which holds the class methods. objc_msgSend finds the method through the receiver's isa and the
 * selector, as Apple's does. Selectors are interned C strings, so one name always gives the same SEL.
 * Every object and string lives in a static arena inside this library, so handles are above 2**32 and a value cut
 * to 32 bits on its way in cannot find its object.
 */
#if !defined(__x86_64__)
#error "the stand-in libobjc is x86_64 only (its objc_msgSend is x86_64 assembly)"
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

typedef const char *SEL;
typedef struct fake_class fake_class;
typedef struct fake_object { fake_class *isa; } fake_object;
typedef fake_object *id;
typedef struct { SEL sel; void *imp; } fake_method;
struct fake_class { fake_class *isa; const char *name; int nmethods; fake_method methods[16]; };

typedef struct { uint64_t width, height, depth; } MTLSize;  /* Metal: NSUInteger x 3, 24 bytes */
typedef struct { uint64_t location, length; } NSRange;      /* Foundation: NSUInteger x 2, 16 bytes */
typedef signed char BOOL;                                   /* objc.h on x86_64 */

/* ---- what the tests read back ---------------------------------------------------------------------------- */

typedef struct {
    uint64_t calls;          /* messages a method answered */
    uint64_t unrecognized;   /* messages to a non-nil receiver that no method answers */
    uint64_t self;           /* receiver and _cmd of the last method call */
    uint64_t cmd;
    uint64_t nwords;         /* integer-class values the last method received, in order */
    uint64_t words[16];
    uint64_t nreals;         /* double values it received */
    double reals[4];
    char selector[128];      /* the selector of the last call (or of the last unrecognized message) */
} fake_record;

EXPORT fake_record fake_last;
EXPORT double fake_gpu_start_time = 0.0;           /* what GPUStartTime / GPUEndTime return */
EXPORT double fake_gpu_end_time = 0.0;
EXPORT uint64_t fake_signaled_value = 0;           /* what signaledValue returns */
EXPORT uint64_t fake_bool_word = 1;                /* the whole of rax that waitUntilSignaledValue:timeoutMS: leaves */
EXPORT uint64_t fake_status = 0;                   /* what status returns */
EXPORT int64_t fake_pool_depth = 0;                /* autorelease pools pushed and not popped */
EXPORT uint64_t fake_devices_created = 0;

/* ---- arena, selectors, classes ------------------------------------------------------------------------- */

static _Alignas(16) unsigned char arena[1 << 20];
static size_t arena_used;

static void *arena_alloc(size_t n) {
    size_t at = (arena_used + 15) & ~(size_t)15;
    if (at + n > sizeof arena) return NULL;
    arena_used = at + n;
    memset(arena + at, 0, n);
    return arena + at;
}

static SEL sels[512];
static int nsels;

static SEL find_sel(SEL maybe) {
    for (int i = 0; i < nsels; i++) if (sels[i] == maybe) return maybe;
    return NULL;
}

EXPORT SEL sel_registerName(const char *name) {
    for (int i = 0; i < nsels; i++) if (strcmp(sels[i], name) == 0) return sels[i];
    if (nsels == (int)(sizeof sels / sizeof sels[0])) return NULL;
    char *copy = arena_alloc(strlen(name) + 1);
    if (!copy) return NULL;
    strcpy(copy, name);
    sels[nsels++] = copy;
    return copy;
}

static fake_class *classes[32];
static int nclasses;

static fake_class *new_class(const char *name, int with_meta) {
    fake_class *c = arena_alloc(sizeof *c);
    c->name = name;
    if (with_meta) {
        c->isa = arena_alloc(sizeof *c->isa);
        c->isa->name = name;
    }
    classes[nclasses++] = c;
    return c;
}

static void add_method(fake_class *c, const char *selector, void *imp) {
    c->methods[c->nmethods].sel = sel_registerName(selector);
    c->methods[c->nmethods].imp = imp;
    c->nmethods++;
}

EXPORT id objc_getClass(const char *name) {
    for (int i = 0; i < nclasses; i++) if (strcmp(classes[i]->name, name) == 0) return (id)classes[i];
    return NULL;
}

HIDDEN void fake_nil_imp(void);  /* objc_msgSend_x86_64.S */

/* objc_msgSend's lookup: the method of the receiver's class for _cmd. It first overwrites every argument
 * register (as any C function may), so objc_msgSend must have saved them. */
HIDDEN void *fake_lookup(id self, SEL cmd) {
    __asm__ volatile(
        "movq $-1, %%rdi\n\tmovq $-1, %%rsi\n\tmovq $-1, %%rdx\n\tmovq $-1, %%rcx\n\t"
        "movq $-1, %%r8\n\tmovq $-1, %%r9\n\t"
        "pcmpeqd %%xmm0, %%xmm0\n\tpcmpeqd %%xmm1, %%xmm1\n\tpcmpeqd %%xmm2, %%xmm2\n\tpcmpeqd %%xmm3, %%xmm3\n\t"
        "pcmpeqd %%xmm4, %%xmm4\n\tpcmpeqd %%xmm5, %%xmm5\n\tpcmpeqd %%xmm6, %%xmm6\n\tpcmpeqd %%xmm7, %%xmm7"
        ::: "rdi", "rsi", "rdx", "rcx", "r8", "r9",
            "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "memory");
    if (self == NULL) return (void *)fake_nil_imp;
    fake_class *c = self->isa;
    for (int i = 0; c != NULL && i < c->nmethods; i++)
        if (c->methods[i].sel == cmd) return c->methods[i].imp;
    fake_last.unrecognized++;
    SEL known = find_sel(cmd);
    strncpy(fake_last.selector, known ? known : "<not a registered SEL>", sizeof fake_last.selector - 1);
    return (void *)fake_nil_imp;
}

static void record(id self, SEL cmd, int nwords, const uint64_t *words, int nreals, const double *reals) {
    fake_last.calls++;
    fake_last.self = (uint64_t)(uintptr_t)self;
    fake_last.cmd = (uint64_t)(uintptr_t)cmd;
    fake_last.nwords = (uint64_t)nwords;
    for (int i = 0; i < nwords && i < 16; i++) fake_last.words[i] = words[i];
    fake_last.nreals = (uint64_t)nreals;
    for (int i = 0; i < nreals && i < 4; i++) fake_last.reals[i] = reals[i];
    strncpy(fake_last.selector, find_sel(cmd) ? cmd : "<not a registered SEL>", sizeof fake_last.selector - 1);
}

#define W(...) (int)(sizeof((uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t)), (uint64_t[]){__VA_ARGS__}
#define U(x) ((uint64_t)(uintptr_t)(x))

/* ---- objects ---------------------------------------------------------------------------------------------- */

static fake_class *Device, *Queue, *CommandBuffer, *Encoder, *Event, *ICB, *ICBCommand, *Buffer, *NSString,
    *PipelineDescriptor;
static id the_device, the_queue, the_cmdbuf, the_encoder, the_event, the_icb, the_icbcmd, the_descriptor;

typedef struct { fake_class *isa; uint64_t length, options; unsigned char contents[256]; } fake_buffer;
typedef struct { fake_class *isa; char *utf8; } fake_string;

static id new_object(fake_class *cls, size_t size) {
    id obj = arena_alloc(size);
    if (obj) obj->isa = cls;
    return obj;
}

/* MTLDevice */
static id dev_newBuffer(id self, SEL cmd, uint64_t length, uint64_t options) {
    record(self, cmd, W(length, options), 0, NULL);
    fake_buffer *b = (fake_buffer *)new_object(Buffer, sizeof(fake_buffer));
    if (b) { b->length = length; b->options = options; }
    return (id)b;
}
static id dev_newQueue(id self, SEL cmd, uint64_t max_count) { record(self, cmd, W(max_count), 0, NULL); return the_queue; }
static id dev_newSharedEvent(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return the_event; }
static id dev_newICB(id self, SEL cmd, id desc, uint64_t max_count, uint64_t options) {
    record(self, cmd, W(U(desc), max_count, options), 0, NULL);
    return the_icb;
}
/* Not Metal: a method taking doubles between integers and a method with arguments on the stack, for the tests. */
static void dev_fakeDoubles(id self, SEL cmd, double a, uint64_t w, double b) {
    record(self, cmd, W(w), 2, (double[]){a, b});
}
static void dev_fakeWords(id self, SEL cmd, uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e, uint64_t f) {
    record(self, cmd, W(a, b, c, d, e, f), 0, NULL);
}

/* MTLCommandQueue, MTLCommandBuffer */
static id queue_commandBuffer(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return the_cmdbuf; }
static id cb_encoder(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return the_encoder; }
static void cb_signal(id self, SEL cmd, id event, uint64_t value) { record(self, cmd, W(U(event), value), 0, NULL); }
static void cb_commit(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); }
static uint64_t cb_status(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return fake_status; }
static double cb_start(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return fake_gpu_start_time; }
static double cb_end(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return fake_gpu_end_time; }

/* MTLComputeCommandEncoder */
static void enc_dispatch(id self, SEL cmd, MTLSize grid, MTLSize group) {
    record(self, cmd, W(grid.width, grid.height, grid.depth, group.width, group.height, group.depth), 0, NULL);
}
static void enc_execute(id self, SEL cmd, id icb, NSRange range) {
    record(self, cmd, W(U(icb), range.location, range.length), 0, NULL);
}
static void enc_useResources(id self, SEL cmd, const id *resources, uint64_t count, uint64_t usage) {
    uint64_t words[16] = {count, usage};
    int n = 2;
    for (uint64_t i = 0; i < count && n < 16; i++) words[n++] = U(resources[i]);
    record(self, cmd, n, words, 0, NULL);
}
static void enc_setBuffer(id self, SEL cmd, id buffer, uint64_t offset, uint64_t index) {
    record(self, cmd, W(U(buffer), offset, index), 0, NULL);
}
static void enc_endEncoding(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); }

/* MTLSharedEvent: the BOOL comes back in al; the rest of rax is whatever fake_bool_word says. */
static uint64_t ev_signaledValue(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return fake_signaled_value; }
static uint64_t ev_wait(id self, SEL cmd, uint64_t value, uint64_t timeout_ms) {
    record(self, cmd, W(value, timeout_ms), 0, NULL);
    return fake_bool_word;
}

/* MTLIndirectCommandBuffer and its compute command */
static id icb_command(id self, SEL cmd, uint64_t index) { record(self, cmd, W(index), 0, NULL); return the_icbcmd; }
static void icbcmd_dispatch(id self, SEL cmd, MTLSize grid, MTLSize group) {
    record(self, cmd, W(grid.width, grid.height, grid.depth, group.width, group.height, group.depth), 0, NULL);
}
static void icbcmd_setKernelBuffer(id self, SEL cmd, id buffer, uint64_t offset, uint64_t index) {
    record(self, cmd, W(U(buffer), offset, index), 0, NULL);
}

/* MTLBuffer */
static uint64_t buf_length(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return ((fake_buffer *)self)->length; }
static void *buf_contents(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return ((fake_buffer *)self)->contents; }

/* NSString (a class method and an instance method) */
static id str_withUTF8(id self, SEL cmd, const char *utf8) {
    record(self, cmd, W(U(utf8)), 0, NULL);
    fake_string *s = (fake_string *)new_object(NSString, sizeof(fake_string));
    if (s && (s->utf8 = arena_alloc(strlen(utf8) + 1)) != NULL) strcpy(s->utf8, utf8);
    return (id)s;
}
static const char *str_UTF8String(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return ((fake_string *)self)->utf8; }

/* MTLComputePipelineDescriptor: +new and a BOOL setter (BOOL is a signed char on x86_64) */
static id desc_new(id self, SEL cmd) { record(self, cmd, 0, NULL, 0, NULL); return the_descriptor; }
static void desc_setSupportICB(id self, SEL cmd, BOOL flag) { record(self, cmd, W((uint64_t)(unsigned char)flag), 0, NULL); }

/* ---- C functions ------------------------------------------------------------------------------------------ */

EXPORT id MTLCreateSystemDefaultDevice(void) { fake_devices_created++; return the_device; }

static int64_t pool_tokens[64];
EXPORT void *objc_autoreleasePoolPush(void) {
    int64_t depth = fake_pool_depth++;
    return &pool_tokens[depth & 63];
}
EXPORT void objc_autoreleasePoolPop(void *token) {
    if (token == &pool_tokens[(fake_pool_depth - 1) & 63]) fake_pool_depth--;
    else fake_pool_depth = -1000;  /* popped out of order: the tests see it */
}

__attribute__((constructor)) static void setup(void) {
    Device = new_class("FakeMTLDevice", 0);
    add_method(Device, "newBufferWithLength:options:", (void *)dev_newBuffer);
    add_method(Device, "newCommandQueueWithMaxCommandBufferCount:", (void *)dev_newQueue);
    add_method(Device, "newSharedEvent", (void *)dev_newSharedEvent);
    add_method(Device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", (void *)dev_newICB);
    add_method(Device, "fakeDouble:word:double:", (void *)dev_fakeDoubles);
    add_method(Device, "fakeWords:b:c:d:e:f:", (void *)dev_fakeWords);
    Queue = new_class("FakeMTLCommandQueue", 0);
    add_method(Queue, "commandBuffer", (void *)queue_commandBuffer);
    CommandBuffer = new_class("FakeMTLCommandBuffer", 0);
    add_method(CommandBuffer, "computeCommandEncoder", (void *)cb_encoder);
    add_method(CommandBuffer, "encodeSignalEvent:value:", (void *)cb_signal);
    add_method(CommandBuffer, "commit", (void *)cb_commit);
    add_method(CommandBuffer, "status", (void *)cb_status);
    add_method(CommandBuffer, "GPUStartTime", (void *)cb_start);
    add_method(CommandBuffer, "GPUEndTime", (void *)cb_end);
    Encoder = new_class("FakeMTLComputeCommandEncoder", 0);
    add_method(Encoder, "dispatchThreadgroups:threadsPerThreadgroup:", (void *)enc_dispatch);
    add_method(Encoder, "executeCommandsInBuffer:withRange:", (void *)enc_execute);
    add_method(Encoder, "useResources:count:usage:", (void *)enc_useResources);
    add_method(Encoder, "setBuffer:offset:atIndex:", (void *)enc_setBuffer);
    add_method(Encoder, "endEncoding", (void *)enc_endEncoding);
    Event = new_class("FakeMTLSharedEvent", 0);
    add_method(Event, "signaledValue", (void *)ev_signaledValue);
    add_method(Event, "waitUntilSignaledValue:timeoutMS:", (void *)ev_wait);
    ICB = new_class("FakeMTLIndirectCommandBuffer", 0);
    add_method(ICB, "indirectComputeCommandAtIndex:", (void *)icb_command);
    ICBCommand = new_class("FakeMTLIndirectComputeCommand", 0);
    add_method(ICBCommand, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (void *)icbcmd_dispatch);
    add_method(ICBCommand, "setKernelBuffer:offset:atIndex:", (void *)icbcmd_setKernelBuffer);
    Buffer = new_class("FakeMTLBuffer", 0);
    add_method(Buffer, "length", (void *)buf_length);
    add_method(Buffer, "contents", (void *)buf_contents);
    NSString = new_class("NSString", 1);
    add_method(NSString->isa, "stringWithUTF8String:", (void *)str_withUTF8);
    add_method(NSString, "UTF8String", (void *)str_UTF8String);
    PipelineDescriptor = new_class("MTLComputePipelineDescriptor", 1);
    add_method(PipelineDescriptor->isa, "new", (void *)desc_new);
    add_method(PipelineDescriptor, "setSupportIndirectCommandBuffers:", (void *)desc_setSupportICB);

    the_device = new_object(Device, sizeof(fake_object));
    the_queue = new_object(Queue, sizeof(fake_object));
    the_cmdbuf = new_object(CommandBuffer, sizeof(fake_object));
    the_encoder = new_object(Encoder, sizeof(fake_object));
    the_event = new_object(Event, sizeof(fake_object));
    the_icb = new_object(ICB, sizeof(fake_object));
    the_icbcmd = new_object(ICBCommand, sizeof(fake_object));
    the_descriptor = new_object(PipelineDescriptor, sizeof(fake_object));
}
