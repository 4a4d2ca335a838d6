/* objc_msgSend of the stand-in libobjc (x86_64, System V ABI).
 *
 * Like Apple's: find the method for (receiver, selector) and jump to it, so the method receives the caller's
 * arguments exactly as they were passed: rdi (self), rsi (_cmd), rdx, rcx, r8, r9, xmm0-7, al (the number of
 * vector registers a variadic caller used) and the stack (a 24-byte MTLSize passed by value lives there).
 * The lookup is a C helper (fake_lookup in fakeobjc.c) that deliberately scribbles on every argument register,
 * so a register this code forgets to save shows up as a wrong value in the tests.
 */
#ifdef __APPLE__
#define SYM(name) _##name
#define HIDDEN(name) .private_extern _##name
#else
#define SYM(name) name
#define HIDDEN(name) .hidden name
#endif

    .text

    .globl SYM(objc_msgSend)
    .p2align 4
SYM(objc_msgSend):
    pushq   %rbp                    /* entry rsp is 8 mod 16; after the push it is 16-byte aligned */
    movq    %rsp, %rbp
    subq    $192, %rsp              /* 8 xmm (128 bytes) + 7 words (56) rounded up to keep the alignment */
    movdqa  %xmm0, 0(%rsp)
    movdqa  %xmm1, 16(%rsp)
    movdqa  %xmm2, 32(%rsp)
    movdqa  %xmm3, 48(%rsp)
    movdqa  %xmm4, 64(%rsp)
    movdqa  %xmm5, 80(%rsp)
    movdqa  %xmm6, 96(%rsp)
    movdqa  %xmm7, 112(%rsp)
    movq    %rdi, 128(%rsp)
    movq    %rsi, 136(%rsp)
    movq    %rdx, 144(%rsp)
    movq    %rcx, 152(%rsp)
    movq    %r8, 160(%rsp)
    movq    %r9, 168(%rsp)
    movq    %rax, 176(%rsp)
    call    SYM(fake_lookup)        /* fake_lookup(self, _cmd) -> the method's address (never NULL) */
    movq    %rax, %r11              /* r11 carries no argument in System V */
    movdqa  0(%rsp), %xmm0
    movdqa  16(%rsp), %xmm1
    movdqa  32(%rsp), %xmm2
    movdqa  48(%rsp), %xmm3
    movdqa  64(%rsp), %xmm4
    movdqa  80(%rsp), %xmm5
    movdqa  96(%rsp), %xmm6
    movdqa  112(%rsp), %xmm7
    movq    128(%rsp), %rdi
    movq    136(%rsp), %rsi
    movq    144(%rsp), %rdx
    movq    152(%rsp), %rcx
    movq    160(%rsp), %r8
    movq    168(%rsp), %r9
    movq    176(%rsp), %rax
    leave                           /* rsp back to the entry value: the return address, then the stack arguments */
    jmp     *%r11

/* The method of a message to nil (or one nobody implements): every return register zero, as Apple's runtime
 * returns nil / 0 / 0.0 for a message to nil. */
    .globl SYM(fake_nil_imp)
    HIDDEN(fake_nil_imp)
    .p2align 4
SYM(fake_nil_imp):
    xorl    %eax, %eax
    xorl    %edx, %edx
    pxor    %xmm0, %xmm0
    pxor    %xmm1, %xmm1
    ret

#ifndef __APPLE__
    .section .note.GNU-stack,"",@progbits
#endif
