// Shared includes of the agentrt CPU kernels (a plain C ABI library, loaded with ctypes).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
