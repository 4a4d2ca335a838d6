/* objc_msgSend with Apple's calling convention on top of the GNU Objective-C runtime (libobjc4), x86_64.
 *
 * GNU's runtime dispatches with objc_msg_lookup(receiver, SEL) -> IMP and has no objc_msgSend. This one saves every
 * argument register (rdi, rsi, rdx, rcx, r8, r9, al, xmm0-7), asks objc_msg_lookup for the method, restores them
 * and jumps to it, so the method receives the caller's registers and stack (a 24-byte MTLSize by value lives
 * there) exactly as Apple's objc_msgSend hands them on. A message to nil returns 0 in rax/rdx and 0.0 in
 * xmm0/xmm1 without a lookup, as Apple's does.
 */
    .text
    .globl  objc_msgSend
    .type   objc_msgSend, @function
    .p2align 4
objc_msgSend:
    testq   %rdi, %rdi
    jz      .Lnil
    pushq   %rbp                    /* entry rsp is 8 mod 16; after the push it is 16-byte aligned */
    movq    %rsp, %rbp
    subq    $192, %rsp              /* 8 xmm (128 bytes) + 7 words (56), rounded to keep the alignment */
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
    call    objc_msg_lookup@PLT     /* objc_msg_lookup(self, _cmd) -> IMP (never NULL) */
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
.Lnil:
    xorl    %eax, %eax
    xorl    %edx, %edx
    pxor    %xmm0, %xmm0
    pxor    %xmm1, %xmm1
    ret
    .size   objc_msgSend, .-objc_msgSend

    .section .note.GNU-stack,"",@progbits
