// The exact polynomial fit of extrapolate.h. N and S are scaled by the largest sample's so the
// small least-squares systems stay well conditioned; Eigen's column-pivoting QR solves them.
#include "perfmodel/extrapolate.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace minidl::gpumodel {
namespace {

struct Term {
  const char* name;
  int n_power, s_power;
};
// In the order terms are taken when the samples cannot determine all six.
constexpr Term kTerms[] = {{"1", 0, 0}, {"N", 1, 0}, {"N*S^2", 1, 2}, {"S^2", 0, 2}, {"N*S", 1, 1}, {"S", 0, 1}};

double term_value(const Term& t, double n, double s) { return std::pow(n, t.n_power) * std::pow(s, t.s_power); }

std::string describe(size_t i, const Work& w) {
  std::ostringstream os;
  os << "launch " << i << " (" << w.key() << (w.parameters.empty() ? "" : " " + w.parameters) << ", block "
     << w.block_threads << ")";
  return os.str();
}

std::string format_dims(const Work& w, const std::vector<double>& v) {
  auto d = [&](int i) { return static_cast<long long>(std::llround(v[kDims + i])); };
  std::ostringstream os;
  if (w.op.rfind("cuDNN conv", 0) == 0)
    os << "x " << d(0) << "x" << d(1) << "x" << d(2) << "x" << d(3) << ", w " << d(4) << "x"
       << d(1) / std::max(1LL, d(9))
       << "x" << d(5) << "x" << d(6) << ", y " << d(0) << "x" << d(4) << "x" << d(7) << "x" << d(8);
  else if (w.op == "cuBLAS gemm")
    os << "m " << d(0) << " n " << d(1) << " k " << d(2) << " batch " << d(3);
  else
    os << d(0) << " bytes";
  return os.str();
}

}  // namespace

Fit fit_samples(const std::vector<StepProfile>& samples) {
  MINIDL_CHECK(!samples.empty(), "gpumodel: no sample steps to extrapolate from");
  const StepProfile& first = samples.front();
  for (const StepProfile& s : samples) {
    MINIDL_CHECK(s.work.size() == first.work.size(), "gpumodel: the step at batch ", s.batch, ", image ", s.image,
                 " ran ", s.work.size(), " launches and calls, the one at batch ", first.batch, ", image ",
                 first.image, " ran ", first.work.size(),
                 ": the model needs the same sequence at every size (a skipped AMP step? a size-dependent path?)");
    for (size_t i = 0; i < s.work.size(); ++i)
      MINIDL_CHECK(s.work[i].same_site(first.work[i]), "gpumodel: the steps differ at ", describe(i, first.work[i]),
                   ": batch ", s.batch, ", image ", s.image, " ran ", describe(i, s.work[i]));
  }
  Fit f;
  for (const StepProfile& s : samples) {
    f.n_scale = std::max(f.n_scale, static_cast<double>(s.batch));
    f.s_scale = std::max(f.s_scale, static_cast<double>(s.image));
  }
  // Terms: taken in order while they add rank, at most one per sample.
  std::vector<const Term*> used;
  Eigen::MatrixXd a(static_cast<Eigen::Index>(samples.size()), 0);
  for (const Term& t : kTerms) {
    if (used.size() >= samples.size()) break;
    Eigen::MatrixXd b(a.rows(), a.cols() + 1);
    b.leftCols(a.cols()) = a;
    for (size_t r = 0; r < samples.size(); ++r)
      b(static_cast<Eigen::Index>(r), a.cols()) =
          term_value(t, samples[r].batch / f.n_scale, samples[r].image / f.s_scale);
    if (Eigen::ColPivHouseholderQR<Eigen::MatrixXd>(b).rank() == b.cols()) {
      a = b;
      used.push_back(&t);
    }
  }
  for (const Term* t : used) f.terms.push_back(t->name);
  const auto qr = a.colPivHouseholderQr();
  f.sites = first.work;
  f.coefficients.resize(first.work.size());
  for (size_t i = 0; i < first.work.size(); ++i) {
    const size_t nf = first.work[i].v.size();
    f.coefficients[i].resize(nf);
    for (size_t k = 0; k < nf; ++k) {
      Eigen::VectorXd y(static_cast<Eigen::Index>(samples.size()));
      for (size_t r = 0; r < samples.size(); ++r) y(static_cast<Eigen::Index>(r)) = samples[r].work[i].v[k];
      const Eigen::VectorXd c = qr.solve(y);
      f.coefficients[i][k].assign(c.data(), c.data() + c.size());
    }
  }
  // Remember which terms, by index into kTerms, in the names (predict looks them up).
  return f;
}

StepProfile predict(const Fit& fit, int64_t batch, int64_t image) {
  StepProfile p;
  p.batch = batch;
  p.image = image;
  std::vector<double> values;
  for (const std::string& name : fit.terms)
    for (const Term& t : kTerms)
      if (name == t.name) values.push_back(term_value(t, batch / fit.n_scale, image / fit.s_scale));
  p.work = fit.sites;
  for (size_t i = 0; i < p.work.size(); ++i) {
    Work& w = p.work[i];
    for (size_t k = 0; k < w.v.size(); ++k) {
      double x = 0.0;
      for (size_t t = 0; t < values.size(); ++t) x += fit.coefficients[i][k][t] * values[t];
      w.v[k] = std::max(0.0, std::round(x));
    }
    if (w.kind != Work::Kind::Kernel) w.shapes = format_dims(w, w.v);
  }
  return p;
}

FitError compare(const StepProfile& predicted, const StepProfile& measured) {
  MINIDL_CHECK(predicted.work.size() == measured.work.size(), "gpumodel: the prediction has ",
               predicted.work.size(), " launches, the measured step ", measured.work.size());
  FitError e;
  double pb = 0, mb = 0, pf = 0, mf = 0;
  for (size_t i = 0; i < measured.work.size(); ++i) {
    const Work& p = predicted.work[i];
    const Work& m = measured.work[i];
    MINIDL_CHECK(p.same_site(m), "gpumodel: the measured step differs at ", describe(i, p));
    const bool kernel = m.kind == Work::Kind::Kernel;
    for (size_t k = 0; k < m.v.size(); ++k) {
      ++e.fields;
      if (p.v[k] == m.v[k]) ++e.exact_fields;
      if (m.v[k] == 0.0) continue;
      const double rel = std::abs(p.v[k] - m.v[k]) / std::abs(m.v[k]);
      if (rel > e.max_relative) {
        e.max_relative = rel;
        std::ostringstream os;
        os << describe(i, m) << ": " << field_name(kernel, static_cast<int>(k)) << " predicted " << p.v[k]
           << ", measured " << m.v[k];
        e.worst = os.str();
      }
    }
    if (kernel) {
      pb += 32.0 * (p.v[kUniqueSectorsRead] + p.v[kUniqueSectorsWritten]);
      mb += 32.0 * (m.v[kUniqueSectorsRead] + m.v[kUniqueSectorsWritten]);
    } else {
      pb += p.v[kMinBytes];
      mb += m.v[kMinBytes];
      pf += p.v[kFlops];
      mf += m.v[kFlops];
    }
  }
  e.dram_bytes_relative = mb > 0 ? std::abs(pb - mb) / mb : 0.0;
  e.flops_relative = mf > 0 ? std::abs(pf - mf) / mf : 0.0;
  return e;
}

}  // namespace minidl::gpumodel
