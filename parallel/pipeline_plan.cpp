#include "parallel/pipeline_plan.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include "runtime/error.h"

namespace cutrain::parallel {

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::regex make_regex(const std::string& re, const std::string& where) {
  try {
    return std::regex(re, std::regex::icase | std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    CUTRAIN_FAIL(where, ": type:", re, ": expected a regular expression, found one that does not compile (", e.what(),
                 ")");
  }
}
std::string with_commas(std::size_t v) {
  std::string s = std::to_string(v);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(std::size_t(i), ",");
  return s;
}
}  // namespace

std::vector<PipelineLayer> pipeline_layers(const model::TransformerParams& t) {
  std::vector<PipelineLayer> v;
  const int n = int(t.units().size());
  for (int u = 0; u < n; ++u) {
    const model::ParamUnit& unit = t.units()[std::size_t(u)];
    PipelineLayer l;
    l.type = u == t.embedding_unit() ? "Embedding"
             : u == t.head_unit()    ? (t.dims().arch == model::Arch::Gpt2 ? "FinalLayerNorm" : "OutputHead")
                                     : "TransformerBlock";
    for (int i = unit.first; i < unit.last; ++i) l.params += t.tensor(i).count;
    v.push_back(l);
  }
  return v;
}

PartitionMethod parse_partition_method(const std::string& text, const std::string& where) {
  PartitionMethod m;
  m.text = text;
  const std::string l = lower(text);
  if (l == "parameters") {
    m.kind = PartitionKind::Parameters;
  } else if (l == "uniform") {
    m.kind = PartitionKind::Uniform;
  } else if (l.rfind("type:", 0) == 0) {
    m.kind = PartitionKind::Type;
    m.regex = text.substr(5);
    CUTRAIN_CHECK(!m.regex.empty(), where, ": expected type:REGEX with a REGEX, found '", text, "'");
    make_regex(m.regex, where);
  } else {
    CUTRAIN_FAIL(where, ": expected parameters, uniform or type:REGEX (DeepSpeed's PipelineModule), found '", text,
                 "'");
  }
  return m;
}

std::vector<int> partition_uniform(int n, int parts) {
  CUTRAIN_CHECK(parts >= 1 && n >= parts, "pipeline: ", n, " layers cannot fill ", parts,
                " stages of at least one layer each");
  std::vector<int> b(std::size_t(parts) + 1, 0);
  const int chunk = n / parts, extra = n % parts;
  for (int p = 0; p < parts; ++p) b[std::size_t(p) + 1] = b[std::size_t(p)] + chunk + (p < extra ? 1 : 0);
  return b;
}

std::vector<int> partition_balanced(const std::vector<std::size_t>& w, int parts) {
  const int n = int(w.size());
  CUTRAIN_CHECK(parts >= 1 && n >= parts, "pipeline: ", n, " layers cannot fill ", parts,
                " stages of at least one layer each");
  std::vector<std::size_t> pre(std::size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) pre[std::size_t(i) + 1] = pre[std::size_t(i)] + w[std::size_t(i)];
  auto sum = [&](int j, int i) { return pre[std::size_t(i)] - pre[std::size_t(j)]; };
  constexpr std::size_t kInf = std::numeric_limits<std::size_t>::max();
  // Pass 1: the smallest possible largest part (f[k][i]: the first i layers in k parts).
  std::vector<std::vector<std::size_t>> f(std::size_t(parts) + 1, std::vector<std::size_t>(std::size_t(n) + 1, kInf));
  f[0][0] = 0;
  for (int k = 1; k <= parts; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j)
        if (f[std::size_t(k) - 1][std::size_t(j)] != kInf)
          f[std::size_t(k)][std::size_t(i)] =
              std::min(f[std::size_t(k)][std::size_t(i)], std::max(f[std::size_t(k) - 1][std::size_t(j)], sum(j, i)));
  const std::size_t best = f[std::size_t(parts)][std::size_t(n)];
  // Pass 2: among partitions within `best`, the largest possible smallest part; g = -1: none.
  std::vector<std::vector<long long>> g(std::size_t(parts) + 1, std::vector<long long>(std::size_t(n) + 1, -1));
  std::vector<std::vector<int>> from(std::size_t(parts) + 1, std::vector<int>(std::size_t(n) + 1, -1));
  g[0][0] = std::numeric_limits<long long>::max();
  for (int k = 1; k <= parts; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        if (g[std::size_t(k) - 1][std::size_t(j)] < 0 || sum(j, i) > best) continue;
        const long long v = std::min(g[std::size_t(k) - 1][std::size_t(j)], (long long)sum(j, i));
        if (v > g[std::size_t(k)][std::size_t(i)]) {
          g[std::size_t(k)][std::size_t(i)] = v;
          from[std::size_t(k)][std::size_t(i)] = j;
        }
      }
  std::vector<int> b(std::size_t(parts) + 1, 0);
  b[std::size_t(parts)] = n;
  for (int k = parts, i = n; k > 0; --k) i = b[std::size_t(k) - 1] = from[std::size_t(k)][std::size_t(i)];
  return b;
}

PipelinePlan make_pipeline_plan(const std::vector<PipelineLayer>& layers, const PartitionMethod& method, int stages,
                                int micro_batches) {
  const int n = int(layers.size());
  CUTRAIN_CHECK(stages >= 1, "pipeline: expected at least 1 stage, found ", stages);
  CUTRAIN_CHECK(micro_batches >= 1, "pipeline: expected at least 1 micro-batch, found ", micro_batches);
  CUTRAIN_CHECK(stages <= n, "pipeline: ", stages, " stages for a model of ", n,
                " layers (embedding, blocks, head): expected at most ", n, " stages, so that no stage is empty");
  PipelinePlan p;
  p.stages = stages;
  p.micro_batches = micro_batches;
  p.method = method;
  std::vector<std::size_t> w(std::size_t(n), 1);
  if (method.kind == PartitionKind::Parameters)
    for (int i = 0; i < n; ++i) w[std::size_t(i)] = layers[std::size_t(i)].params;
  if (method.kind == PartitionKind::Type) {
    const std::regex re = make_regex(method.regex, "partition_method");
    int matching = 0;
    for (int i = 0; i < n; ++i) {
      w[std::size_t(i)] = std::regex_search(layers[std::size_t(i)].type, re) ? 1 : 0;
      matching += int(w[std::size_t(i)]);
    }
    CUTRAIN_CHECK(matching >= stages, "pipeline: partition_method ", method.text, " matches ", matching,
                  " layer(s) for ", stages, " stages: expected at least one matching layer per stage, so stage ",
                  matching, " would be empty of them");
  }
  const std::vector<int> b =
      method.kind == PartitionKind::Uniform ? partition_uniform(n, stages) : partition_balanced(w, stages);
  for (int s = 0; s < stages; ++s) {
    PipelineStage st;
    st.first = b[std::size_t(s)];
    st.end = b[std::size_t(s) + 1];
    CUTRAIN_CHECK(st.end > st.first, "pipeline: partition_method ", method.text, " leaves stage ", s, " empty");
    for (int i = st.first; i < st.end; ++i) {
      st.params += layers[std::size_t(i)].params;
      st.weight += w[std::size_t(i)];
    }
    CUTRAIN_CHECK(method.kind != PartitionKind::Type || st.weight > 0, "pipeline: partition_method ", method.text,
                  " leaves stage ", s, " without a matching layer");
    p.parts.push_back(st);
  }
  return p;
}

double PipelinePlan::bubble_fraction() const {
  return double(stages - 1) / double(micro_batches + stages - 1);
}

int PipelinePlan::stage_of_layer(int layer) const {
  for (int s = 0; s < stages; ++s)
    if (layer >= parts[std::size_t(s)].first && layer < parts[std::size_t(s)].end) return s;
  CUTRAIN_FAIL("pipeline: layer ", layer, " is in no stage");
}

std::string PipelinePlan::describe(const std::vector<PipelineLayer>& layers) const {
  std::ostringstream os;
  os << "pipeline: " << stages << " stages, partition_method " << method.text << ":";
  for (int s = 0; s < stages; ++s) {
    const PipelineStage& st = parts[std::size_t(s)];
    os << (s ? ";" : "") << " stage " << s << " = layers " << st.first << "-" << st.end - 1 << " (";
    // Runs of one type: "Embedding, TransformerBlock x2".
    for (int i = st.first; i < st.end;) {
      int j = i;
      while (j < st.end && layers[std::size_t(j)].type == layers[std::size_t(i)].type) ++j;
      os << (i > st.first ? ", " : "") << layers[std::size_t(i)].type;
      if (j - i > 1) os << " x" << j - i;
      i = j;
    }
    os << ", " << with_commas(st.params) << " params)";
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", bubble_fraction());
  os << "; 1F1B over " << micro_batches << " micro-batches, predicted bubble fraction " << buf << " ((S-1)/(M+S-1) = "
     << stages - 1 << "/" << micro_batches + stages - 1 << ")";
  return os.str();
}

std::vector<PipeAction> one_f_one_b(int stage, int stages, int m) {
  CUTRAIN_CHECK(stages >= 1 && stage >= 0 && stage < stages && m >= 1, "pipeline: no schedule for stage ", stage,
                " of ", stages, " over ", m, " micro-batches");
  const int warm = std::min(stages - stage - 1, m);
  std::vector<PipeAction> a;
  int f = 0, b = 0;
  for (; f < warm; ++f) a.push_back({PipeAction::Forward, f});
  while (f < m) {
    a.push_back({PipeAction::Forward, f++});
    a.push_back({PipeAction::Backward, b++});
  }
  while (b < m) a.push_back({PipeAction::Backward, b++});
  return a;
}

}  // namespace cutrain::parallel
