// Which W8A8 kernel this process may run: what the CPU reports, what the kernel grants,
// and what the environment asks for.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/gemm_w8a8_parts.hpp"

namespace troupe {

namespace w8a8 {

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace w8a8

namespace {

using w8a8::env_set;

// Linux: tile data is off until a process asks for it.
constexpr long arch_req_xcomp_perm = 0x1023;
constexpr long xfeature_xtiledata = 18;

// AVX-512 (F, BW, VL) with VNNI, F16C, and the OS saving AVX-512 state.
bool detect_vnni() {
  if (env_set("TROUPE_NO_W8A8")) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1) && (c >> 11 & 1))) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1) || !(c >> 29 & 1)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xE6) == 0xE6;
}

bool detect_amx() {
  if (!detect_vnni() || env_set("TROUPE_NO_AMX")) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1)) return false;  // TILE, INT8
  return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}

}  // namespace

bool vnni_available() {
  static const bool yes = detect_vnni();
  return yes;
}

bool amx_available() {
  static const bool yes = detect_amx();
  return yes;
}

std::optional<w8a8_kernel> w8a8_kernel_in_use() {
  static const std::optional<w8a8_kernel> k = []() -> std::optional<w8a8_kernel> {
    if (amx_available()) return w8a8_kernel::amx;
    if (vnni_available()) return w8a8_kernel::vnni;
    const char* v = std::getenv("TROUPE_W8A8");
    if (v && std::strcmp(v, "scalar") == 0 && !env_set("TROUPE_NO_W8A8")) return w8a8_kernel::scalar;
    return std::nullopt;
  }();
  return k;
}

}  // namespace troupe
