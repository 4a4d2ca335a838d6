/* The rest of Apple's libobjc that MetalBridge calls and GNU's libobjc4 lacks: autorelease pools.
 * Linked with objc_msgSend_gnu_<arch>.S and -lobjc into the stand-in libobjc (sel_registerName and objc_getClass
 * come from libobjc4 itself). Pools here only count their depth: the fake Metal never autoreleases. */
#include <stdint.h>

__attribute__((visibility("default"))) int64_t fake_pool_depth = 0;

__attribute__((visibility("default"))) void *objc_autoreleasePoolPush(void) {
    fake_pool_depth++;
    return (void *)(uintptr_t)(0x5000 + 16 * fake_pool_depth);
}

__attribute__((visibility("default"))) void objc_autoreleasePoolPop(void *pool) {
    (void)pool;
    fake_pool_depth--;
}
