// The MoE layer's CPU reference (model/moe_reference.h) against DeepSpeed's deepspeed.moe.layer.MoE:
// the cases bench/peers/moe_cpu_check.py ran through DeepSpeed on the CPU (fp32 and fp64; top-1 /
// top-2, capacity factors whose fp32 capacity differs from the exact one, dropping or not, the
// evaluation capacity, min_capacity, PR-MoE), with DeepSpeed's inputs, weights and results. Read
// from tests/data/moe_deepspeed_cases.safetensors (its `--write_golden`), or from the file named by
// $CUTRAIN_MOE_DS_CASES (the script's fresh cases). Per case: capacity and counts exactly, every
// route's expert, slot and combine weight, output, l_aux, the gradients of sum(out·R) + coeff·l_aux
// and those of l_aux alone; one report line per case on stdout, every mismatch named.
//
// DeepSpeed computes the gate in fp32 (its input and weight cast, softmax in fp32) whatever the
// model's dtype; the reference in fp64: gate-derived values agree to fp32 rounding, not further.
// Top-1 "topk" cases are DeepSpeed's own use_rts=False choice of the routes an over-capacity expert
// keeps (torch.topk over equal mask values: unspecified order); cutrain keeps the first in token
// order, so those cases check what does not depend on the choice and list the routes kept
// differently; the "first" cases make DeepSpeed keep the first ones and check everything.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "model/moe_config.h"
#include "model/moe_reference.h"
#include "runtime/safetensors.h"

using namespace cutrain;

namespace {

std::string cases_path() {
  const char* env = std::getenv("CUTRAIN_MOE_DS_CASES");
  return env && *env ? std::string(env) : std::string(CUTRAIN_SOURCE_DIR) + "/tests/data/moe_deepspeed_cases.safetensors";
}

template <typename T>
std::vector<T> read_as(const SafetensorsReader& f, const std::string& name) {
  const auto& info = f.tensor(name);
  std::vector<T> v(info.numel());
  f.read(name, v.data(), v.size() * sizeof(T));
  return v;
}

// ||a - b|| / ||b||, 0 for two zero vectors.
double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double d = a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

std::vector<double> slice(const std::vector<double>& p, std::size_t at, std::size_t n) {
  return {p.begin() + at, p.begin() + at + n};
}

struct Case {
  nlohmann::json meta;
  std::string name;
  model::MoeConfig c;
  int T = 0;
  bool train = true;
  double coeff = 0;
};

Case parse(const nlohmann::json& m) {
  Case cs;
  cs.meta = m;
  cs.name = m.at("name");
  cs.c.hidden = m.at("hidden");
  cs.c.ffn = m.at("ffn");
  cs.c.experts = m.at("experts");
  cs.c.k = m.at("k");
  cs.c.capacity_factor = m.at("capacity_factor");
  cs.c.eval_capacity_factor = m.at("eval_capacity_factor");
  cs.c.min_capacity = m.at("min_capacity");
  cs.c.drop_tokens = m.at("drop_tokens");
  cs.c.use_residual = m.at("use_residual");
  cs.T = m.at("tokens");
  cs.train = m.at("train");
  cs.coeff = m.at("aux_coeff");
  return cs;
}

}  // namespace

TEST(MoeDeepSpeed, ReferenceMatchesDeepSpeedCases) {
  const std::string path = cases_path();
  SafetensorsReader f(path);
  const auto& md = f.metadata();
  ASSERT_TRUE(md.count("cases")) << path << ": no \"cases\" metadata (written by bench/peers/moe_cpu_check.py?)";
  const auto cases = nlohmann::json::parse(md.at("cases"));
  ASSERT_GE(cases.size(), 1u) << path;
  std::printf("DeepSpeed %s (torch %s) cases from %s\n", md.count("deepspeed") ? md.at("deepspeed").c_str() : "?",
              md.count("torch") ? md.at("torch").c_str() : "?", path.c_str());
  for (const auto& m : cases) {
    const Case cs = parse(m);
    const auto& c = cs.c;
    const int T = cs.T, E = c.experts, H = c.hidden, F = c.ffn, k = c.k;
    const std::string p = cs.name + ".", in = m.value("inputs", cs.name) + ".";  // results, inputs
    SCOPED_TRACE(cs.name);
    // DeepSpeed's gate runs in fp32 in both dtypes: the gate-derived values and gradients carry its
    // rounding (up to ~1.4e-4 seen in dwg where most top-2 routes drop: a token's one kept route
    // weighs p / p, whose fp32 gradient is rounding noise, not 0). The "gate64" cases run its gating
    // functions on fp64 logits: agreement to fp64 rounding (1.4e-14 seen), the tight check.
    const double tol = m.value("gate", "fp32") == "fp64" ? 1e-11 : 1e-3;
    const auto lay = model::moe_param_layout(c);
    std::vector<double> params(lay.total, 0.0);
    auto put = [&](const std::string& n, std::size_t at) {
      const auto v = read_as<double>(f, in + n);
      ASSERT_LE(at + v.size(), params.size()) << n;
      std::copy(v.begin(), v.end(), params.begin() + at);
    };
    put("wg", lay.wg), put("w1", lay.w1), put("w2", lay.w2);
    if (c.use_residual) put("r1", lay.r1), put("r2", lay.r2), put("cw", lay.cw), put("cb", lay.cb);
    const auto x = read_as<double>(f, in + "x");
    const auto R = read_as<double>(f, in + "R");
    ASSERT_EQ(x.size(), std::size_t(T) * H);

    model::MoeReference ref(c);
    std::vector<double> y(x.size()), dx(x.size()), dparams(lay.total, 0.0);
    const double l_aux = ref.forward(params.data(), x.data(), T, cs.train, y.data());
    ref.backward(params.data(), R.data(), cs.coeff, dx.data(), dparams.data());
    std::vector<double> zero(x.size(), 0.0), aux_dx(x.size()), aux_dparams(lay.total, 0.0);
    ref.backward(params.data(), zero.data(), 1.0, aux_dx.data(), aux_dparams.data());

    std::ostringstream rep;
    std::vector<std::string> bad;
    // Capacity and the counts before dropping: exact.
    const auto ds_cap = read_as<std::int64_t>(f, p + "capacity").at(0);
    rep << "capacity " << ref.capacity();
    if (ref.capacity() != ds_cap) bad.push_back("capacity " + std::to_string(ref.capacity()) + " vs " + std::to_string(ds_cap));
    const auto ds_counts = read_as<std::int64_t>(f, p + "exp_counts");
    for (int e = 0; e < E; ++e)
      if (ref.expert_counts()[e] != ds_counts[e])
        bad.push_back("expert " + std::to_string(e) + " count " + std::to_string(ref.expert_counts()[e]) + " vs " +
                      std::to_string(ds_counts[e]));
    // Routes: DeepSpeed's [k, T] expert (-1 dropped), slot and weight against [T, k].
    const auto ds_e = read_as<std::int64_t>(f, p + "route_expert");
    const auto ds_slot = read_as<std::int64_t>(f, p + "route_slot");
    const auto ds_w = read_as<double>(f, p + "route_weight");
    const bool own_choice = m.at("selection") == "topk";
    int kept_differently = 0, same_kept = 0;
    std::vector<int> kept_ds(E, 0);
    std::ostringstream diff;
    std::vector<double> w_ours, w_ds;
    for (int s = 0; s < T; ++s)
      for (int r = 0; r < k; ++r) {
        const std::size_t ours = std::size_t(s) * k + r, theirs = std::size_t(r) * T + s;
        const int pos = ref.position()[ours];
        const int e = pos >= 0 ? ref.expert()[ours] : -1;
        if (ds_e[theirs] >= 0) ++kept_ds[ds_e[theirs]];
        if (e >= 0 && ds_e[theirs] >= 0 && e != ds_e[theirs])
          bad.push_back("token " + std::to_string(s) + " route " + std::to_string(r) + " expert " + std::to_string(e) +
                        " vs " + std::to_string(ds_e[theirs]));
        if ((e >= 0) != (ds_e[theirs] >= 0)) {
          ++kept_differently;
          diff << " " << s << (e >= 0 ? "(ours)" : "(DeepSpeed's)");
          if (!own_choice)
            bad.push_back("token " + std::to_string(s) + " route " + std::to_string(r) + (e >= 0 ? " kept" : " dropped") +
                          " here, " + (e >= 0 ? "dropped" : "kept") + " by DeepSpeed");
          continue;
        }
        if (e < 0) continue;
        ++same_kept;
        if (pos != ds_slot[theirs] && !own_choice)
          bad.push_back("token " + std::to_string(s) + " route " + std::to_string(r) + " slot " + std::to_string(pos) +
                        " vs " + std::to_string(ds_slot[theirs]));
        w_ours.push_back(ref.weight()[ours]);
        w_ds.push_back(ds_w[theirs]);
      }
    for (int e = 0; e < E; ++e)
      if (ref.kept_counts()[e] != kept_ds[e])
        bad.push_back("expert " + std::to_string(e) + " kept " + std::to_string(ref.kept_counts()[e]) + " vs " +
                      std::to_string(kept_ds[e]));
    rep << ", routes kept by both " << same_kept << ", dropped " << ref.dropped();
    if (kept_differently) rep << ", kept by one side only " << kept_differently << " (tokens" << diff.str() << ")";
    // The numbers. A topk case stores its routing alone (its other numbers belong to routes this
    // side drops): there the weights of the routes both keep and l_aux, which the choice leaves alone.
    struct Row {
      const char* what;
      double err;
    };
    const auto ds_l_aux = read_as<double>(f, p + "l_aux").at(0);
    std::vector<Row> rows = {{"weights", rel(w_ours, w_ds)}, {"l_aux", std::abs(l_aux - ds_l_aux) / std::abs(ds_l_aux)}};
    if (!own_choice) {
      auto add = [&](const char* what, const std::vector<double>& ours, const std::string& n) {
        rows.push_back({what, rel(ours, read_as<double>(f, p + n))});
      };
      add("out", y, "out");
      add("dx", dx, "dx");
      add("dwg", slice(dparams, lay.wg, std::size_t(E) * H), "dwg");
      add("dw1", slice(dparams, lay.w1, std::size_t(E) * F * H), "dw1");
      add("dw2", slice(dparams, lay.w2, std::size_t(E) * H * F), "dw2");
      add("aux dx", aux_dx, "aux_dx");
      add("aux dwg", slice(aux_dparams, lay.wg, std::size_t(E) * H), "aux_dwg");
      if (c.use_residual) {
        add("dr1", slice(dparams, lay.r1, std::size_t(F) * H), "dr1");
        add("dr2", slice(dparams, lay.r2, std::size_t(H) * F), "dr2");
        add("dcw", slice(dparams, lay.cw, 2 * std::size_t(H)), "dcw");
        add("dcb", slice(dparams, lay.cb, 2), "dcb");
      }
    }
    const Row* worst = &rows[0];
    for (const auto& row : rows) {
      if (row.err > worst->err) worst = &row;
      if (!(row.err <= tol)) {
        char b[96];
        std::snprintf(b, sizeof b, "%s rel %.3g (tolerance %.0e)", row.what, row.err, tol);
        bad.push_back(b);
      }
    }
    char b[96];
    std::snprintf(b, sizeof b, ", worst relative error %.2e (%s)", worst->err, worst->what);
    rep << b;
    std::string verdict = bad.empty() ? "matches" : "MISMATCH:";
    for (const auto& b : bad) verdict += " [" + b + "]";
    std::printf("  %-34s %s; %s\n", cs.name.c_str(), rep.str().c_str(), verdict.c_str());
    EXPECT_TRUE(bad.empty()) << cs.name << ": " << verdict;
  }
}
