// chi_square: Pearson's tests for the tests of samplers and of speculative decoding
// (every draw must be distributed as plain sampling's): observed counts against the
// probabilities they should follow, and two samples against each other. Cells whose
// expectation is under 5 are merged into one, and the critical value is the 1e-4 upper
// quantile of the chi-square distribution with the cells' degrees of freedom: a correct
// sampler fails one check in 10,000.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace troupe::test {

struct chi_square_result {
  double chi = 0.0;
  int dof = 0;
  double critical = 0.0;
  bool passes() const { return chi < critical; }
};

// The chi-square value a correct sampler exceeds with probability 1e-4, for dof degrees
// of freedom (Wilson-Hilferty's approximation).
inline double chi_square_critical(int dof) {
  const double z = 3.719;  // the standard normal's 1e-4 upper quantile
  const double k = std::max(dof, 1);
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

// counts[i] of n draws against probs[i].
inline chi_square_result chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t n) {
  chi_square_result r;
  double rest_obs = 0.0, rest_exp = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n);
    if (e < 5.0) {
      rest_obs += static_cast<double>(counts[i]);
      rest_exp += e;
      continue;
    }
    r.chi += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
    ++cells;
  }
  if (rest_exp > 0.0 || rest_obs > 0.0) {
    r.chi += (rest_obs - rest_exp) * (rest_obs - rest_exp) / std::max(rest_exp, 1e-9);
    ++cells;
  }
  r.dof = cells - 1;
  r.critical = chi_square_critical(r.dof);
  return r;
}

// Whether two samples were drawn from one distribution (a test of homogeneity): a[i]
// and b[i] draws in cell i of each. Cells where either sample's expectation is under 5
// are merged into one.
inline chi_square_result homogeneity(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  chi_square_result r;
  double na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    na += static_cast<double>(a[i]);
    nb += static_cast<double>(b[i]);
  }
  const double n = na + nb;
  double rest_a = 0, rest_b = 0;
  int cells = 0;
  auto add = [&](double oa, double ob) {
    const double ea = na * (oa + ob) / n, eb = nb * (oa + ob) / n;
    r.chi += (oa - ea) * (oa - ea) / std::max(ea, 1e-9) + (ob - eb) * (ob - eb) / std::max(eb, 1e-9);
    ++cells;
  };
  for (size_t i = 0; i < a.size(); ++i) {
    const double oa = static_cast<double>(a[i]), ob = static_cast<double>(b[i]);
    if (std::min(na, nb) * (oa + ob) / n < 5.0) {
      rest_a += oa;
      rest_b += ob;
      continue;
    }
    add(oa, ob);
  }
  if (rest_a + rest_b > 0) add(rest_a, rest_b);
  r.dof = cells - 1;
  r.critical = chi_square_critical(r.dof);
  return r;
}

}  // namespace troupe::test
