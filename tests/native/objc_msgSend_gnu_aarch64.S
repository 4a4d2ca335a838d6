/* objc_msgSend with Apple's calling convention on top of the GNU Objective-C runtime (libobjc4), AArch64.
 *
 * GNU's runtime dispatches with objc_msg_lookup(receiver, SEL) -> IMP and has no objc_msgSend. This one saves every
 * argument register of AAPCS64 (x0-x7, x8 the indirect result, q0-q7), asks objc_msg_lookup for the method,
 * restores them and branches to it through x16 (IP0, free for veneers), so the method receives the caller's
 * registers and stack exactly as Apple's objc_msgSend hands them on: an MTLSize arrives as a pointer to a copy (a
 * composite over 16 bytes), an NSRange in two x registers. A message to nil returns 0 in x0/x1 and 0.0 in d0-d3
 * without a lookup, as Apple's does.
 */
    .text
    .globl  objc_msgSend
    .type   objc_msgSend, %function
    .p2align 4
objc_msgSend:
    cbz     x0, .Lnil
    stp     x29, x30, [sp, #-224]!
    mov     x29, sp
    stp     x0, x1, [sp, #16]
    stp     x2, x3, [sp, #32]
    stp     x4, x5, [sp, #48]
    stp     x6, x7, [sp, #64]
    str     x8, [sp, #80]
    stp     q0, q1, [sp, #96]
    stp     q2, q3, [sp, #128]
    stp     q4, q5, [sp, #160]
    stp     q6, q7, [sp, #192]
    bl      objc_msg_lookup         /* objc_msg_lookup(self, _cmd) -> IMP (never NULL) */
    mov     x16, x0
    ldp     x0, x1, [sp, #16]
    ldp     x2, x3, [sp, #32]
    ldp     x4, x5, [sp, #48]
    ldp     x6, x7, [sp, #64]
    ldr     x8, [sp, #80]
    ldp     q0, q1, [sp, #96]
    ldp     q2, q3, [sp, #128]
    ldp     q4, q5, [sp, #160]
    ldp     q6, q7, [sp, #192]
    ldp     x29, x30, [sp], #224
    br      x16
.Lnil:
    mov     x1, #0
    movi    d0, #0
    movi    d1, #0
    movi    d2, #0
    movi    d3, #0
    ret
    .size   objc_msgSend, .-objc_msgSend

    .section .note.GNU-stack,"",@progbits
