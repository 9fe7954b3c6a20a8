/* Times the compiled model's attention calls from inside the shipped model, with nothing else
 * changed: preloaded (LD_PRELOAD) into a process that opens the wheel's .so, it stands in for
 * torch's C shim aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu (the one function
 * the model calls for attention, resolved when the .so is opened), forwards every call to
 * torch's own and adds up the wall time each took. benchmarks/layers_alone.py reads the totals
 * through attention_timer_totals(). Built by layers_alone.py with the system's C compiler.
 *
 * Why a stand-in and not a profile: the AOTInductor model calls torch's shims directly, past the
 * dispatcher, so torch's profiler never sees them, and the kernel-profile build
 * (cpp.enable_kernel_profile) is a different, slower build. The signature is torch's own
 * (torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h, the same in 2.11 to 2.14).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void *AtenTensorHandle;
typedef int32_t AOTITorchError;
typedef AOTITorchError (*attention_fn)(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle, double, int32_t,
                                       AtenTensorHandle *, double *, AtenTensorHandle *, AtenTensorHandle *);

static attention_fn torch_attention;
static double total_ms;
static long total_calls;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static attention_fn find_torch_attention(void) {
    /* torch's libraries are opened by `import torch`, after this one: look there by name */
    void *torch_cpu = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    void *found = torch_cpu ? dlsym(torch_cpu, "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu") : NULL;
    if (!found) {
        fprintf(stderr, "attention_timer: torch's aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu not found\n");
        abort();
    }
    return (attention_fn)found;
}

AOTITorchError aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu(
    AtenTensorHandle query, AtenTensorHandle key, AtenTensorHandle value, double dropout_p, int32_t is_causal,
    AtenTensorHandle *attn_mask, double *scale, AtenTensorHandle *ret0, AtenTensorHandle *ret1) {
    if (!torch_attention)
        torch_attention = find_torch_attention();
    double started = now_ms();
    AOTITorchError error = torch_attention(query, key, value, dropout_p, is_causal, attn_mask, scale, ret0, ret1);
    total_ms += now_ms() - started;
    total_calls += 1;
    return error;
}

/* The totals since the last reset; a reset (reset != 0) zeroes them after reading. */
void attention_timer_totals(double *ms, long *calls, int reset) {
    *ms = total_ms;
    *calls = total_calls;
    if (reset) {
        total_ms = 0;
        total_calls = 0;
    }
}
