#include "curv/io/zipf_pcfg.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "curv/core/error.h"
#include "test_support.h"

using namespace curv;
using Catch::Matchers::Contains;

namespace {

// Upper 1e-4 quantile of chi-square with `df` degrees of freedom by the Wilson–Hilferty cube
// approximation (within ~1% of the exact quantile for df >= 5): a fit is rejected by chance only
// once in 10^4 runs, and the seeds are fixed anyway.
double chi_square_critical(int64_t df) {
  const double z = 3.719;  // standard normal upper 1e-4 quantile
  const double k = static_cast<double>(df);
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p) {
  double n = 0;
  for (auto c : counts) n += static_cast<double>(c);
  double stat = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = n * p[i];
    stat += (static_cast<double>(counts[i]) - expected) *
            (static_cast<double>(counts[i]) - expected) / expected;
  }
  return stat;
}

size_t argmax(const std::vector<double>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}
size_t argmax(const std::vector<int64_t>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

TEST_CASE("rule choices follow the Zipf law over the grammar's rank permutation", "[zipf]") {
  ZipfPcfgOptions o;
  o.rules_per_symbol = 12;
  o.grammar_seed = 3;
  const ZipfPcfg g(o);
  const int64_t n = 200000;
  const double critical = chi_square_critical(o.rules_per_symbol - 1);
  const std::vector<double> uniform(o.rules_per_symbol,
                                    1.0 / static_cast<double>(o.rules_per_symbol));
  const auto ranks = g.rule_ranks(1, 5);
  for (double s : {1.0, 0.5}) {
    const auto p = g.rule_probabilities(1, 5, s);
    // p_k ∝ k^(-s) by rank: the rank-1 rule over the rank-2 rule is 2^s.
    const auto first = std::find(ranks.begin(), ranks.end(), 1) - ranks.begin();
    const auto second = std::find(ranks.begin(), ranks.end(), 2) - ranks.begin();
    CHECK(p[first] / p[second] == Approx(std::pow(2.0, s)));
    const auto counts = g.sample_rule_counts(1, 5, n, s, 11);
    CHECK(chi_square(counts, p) < critical);
    CHECK(chi_square(counts, uniform) > critical);  // the test has power against "balanced"
    CHECK(argmax(counts) == static_cast<size_t>(first));
    CHECK(argmax(p) == static_cast<size_t>(first));
  }
  const auto p0 = g.rule_probabilities(1, 5, 0.0);
  for (auto x : p0) CHECK(x == Approx(1.0 / 12).epsilon(1e-12));
  CHECK(chi_square(g.sample_rule_counts(1, 5, n, 0.0, 12), uniform) < critical);

  // Which rule is frequent is random: the rank-1 rule sits at different indices across grammars.
  std::set<int64_t> top;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    o.grammar_seed = seed;
    const auto r = ZipfPcfg(o).rule_ranks(0, 0);
    top.insert(std::find(r.begin(), r.end(), 1) - r.begin());
  }
  CHECK(top.size() > 1);
}

TEST_CASE("emissions in the generated stream follow the Zipf law", "[zipf]") {
  // One preterminal as the only level and no BOS: the stream is i.i.d. draws of its emissions.
  ZipfPcfgOptions o;
  o.depth = 1;
  o.bos_token = -1;
  o.emissions_per_symbol = 40;
  o.vocab_size = 64;
  const ZipfPcfg g(o);
  const auto tokens = g.emission_tokens(0);
  std::vector<int64_t> index(o.vocab_size, -1);
  for (size_t k = 0; k < tokens.size(); ++k) index[tokens[k]] = static_cast<int64_t>(k);
  for (double s : {1.0, 0.0}) {
    const auto stream = g.sample_tokens(100000, s, 5);
    std::vector<int64_t> counts(tokens.size(), 0);
    int64_t foreign = 0;  // tokens outside the preterminal's emission set
    for (auto t : stream) index[t] >= 0 ? ++counts[index[t]] : ++foreign;
    REQUIRE(foreign == 0);
    CHECK(chi_square(counts, g.emission_probabilities(0, s)) < chi_square_critical(39));
  }
}

TEST_CASE("the token stream matches the exact token frequencies", "[zipf]") {
  const ZipfPcfg g(ZipfPcfgOptions{});
  for (double s : {1.0, 0.0}) {
    const auto exact = g.token_probabilities(s);
    double sum = 0;
    for (auto p : exact) sum += p;
    CHECK(sum == Approx(1.0).epsilon(1e-12));
    CHECK(exact[0] == Approx(1.0 / g.mean_sentence_length(s)));
    const auto stream = g.sample_tokens(200000, s, 9);
    std::vector<double> empirical(exact.size(), 0.0);
    for (auto t : stream) empirical[t] += 1.0 / static_cast<double>(stream.size());
    // Tokens are correlated within a sentence, so no chi-square here: a total-variation bound
    // a few times what i.i.d. noise gives for 200k tokens over 512 ids (~0.02).
    double tv = 0;
    for (size_t t = 0; t < exact.size(); ++t) tv += 0.5 * std::abs(empirical[t] - exact[t]);
    CHECK(tv < 0.05);
    CHECK(empirical[0] == Approx(exact[0]).epsilon(0.03));
  }
}

TEST_CASE("streams are deterministic and one grammar serves every exponent", "[zipf]") {
  ZipfPcfgOptions train;
  train.exponent = 1.0;
  ZipfPcfgOptions valid = train;
  valid.exponent = 0.0;
  const ZipfPcfg a(train), b(valid);
  CHECK(a.sample_tokens(5000, 1.0, 7) == a.sample_tokens(5000, 1.0, 7));
  CHECK(a.sample_tokens(5000, 1.0, 7) == b.sample_tokens(5000, 1.0, 7));
  CHECK(a.sample_tokens(5000, 1.0, 7) != a.sample_tokens(5000, 1.0, 8));
  CHECK(a.sample_tokens(5000, 1.0, 7) != a.sample_tokens(5000, 0.0, 7));
  CHECK(a.sample_tokens(5000, 1.0, 7).size() >= 5000);

  // Same grammar_seed, same structure whatever the exponent; another seed, another grammar.
  CHECK(a.structure_hash() == b.structure_hash());
  const int64_t last = train.depth - 1;
  for (int64_t p = 0; p < a.num_symbols(last); ++p)
    CHECK(a.emission_tokens(p) == b.emission_tokens(p));
  for (int64_t i = 0; i < a.num_symbols(1); ++i) CHECK(a.rules(1, i) == b.rules(1, i));
  ZipfPcfgOptions other = train;
  other.grammar_seed = 1;
  CHECK(ZipfPcfg(other).structure_hash() != a.structure_hash());
  CHECK(ZipfPcfg(other).emission_tokens(0) != a.emission_tokens(0));

  // Train (s = 1) and validation (s = 0) data have the same support: the tokens the grammar can
  // emit. With the default sizes the dealt emission sets cover the whole vocabulary but the BOS.
  const auto p1 = a.token_probabilities(1.0), p0 = a.token_probabilities(0.0);
  std::set<int64_t> emitted;
  for (int64_t p = 0; p < a.num_symbols(last); ++p) {
    for (auto t : a.emission_tokens(p)) emitted.insert(t);
  }
  CHECK(emitted.size() == 511);
  CHECK(emitted.count(0) == 0);
  int64_t support_differs = 0, outside = 0;
  for (int64_t t = 1; t < train.vocab_size; ++t) support_differs += (p1[t] > 0) != (p0[t] > 0);
  for (auto t : a.sample_tokens(20000, 0.0, 1)) outside += t != 0 && emitted.count(t) == 0;
  CHECK(support_differs == 0);
  CHECK(outside == 0);
}

TEST_CASE("LM windows are shifted token streams", "[zipf]") {
  const ZipfPcfg g(ZipfPcfgOptions{});
  const int64_t n = 6, t = 64;
  const auto [inputs, targets] = g.sample_windows(n, t, 1.0, 3);
  CHECK(inputs.sizes() == at::IntArrayRef({n, t}));
  CHECK(targets.sizes() == at::IntArrayRef({n, t}));
  CHECK(inputs.scalar_type() == at::kLong);
  CHECK(targets.scalar_type() == at::kLong);
  CHECK(at::equal(inputs.narrow(1, 1, t - 1), targets.narrow(1, 0, t - 1)));
  CHECK(inputs.min().item<int64_t>() >= 0);
  CHECK(targets.max().item<int64_t>() < 512);
  // Window i is tokens [i (t+1), (i+1)(t+1)) of the stream with the same seed.
  const auto stream = g.sample_tokens(n * (t + 1), 1.0, 3);
  for (int64_t i = 0; i < n; ++i) {
    CHECK(inputs[i][0].item<int64_t>() == stream[i * (t + 1)]);
    CHECK(targets[i][t - 1].item<int64_t>() == stream[i * (t + 1) + t]);
  }
  CHECK_THROWS_AS(g.sample_windows(0, t, 1.0, 0), InvalidArgument);
}

TEST_CASE("frequency buckets split head from tail by exact token frequency", "[zipf]") {
  const ZipfPcfg g(ZipfPcfgOptions{});
  auto head_size = [](const at::Tensor& b) {
    return b.eq(ZipfPcfg::kHeadBucket).sum().item<int64_t>();
  };
  const auto b1 = g.frequency_buckets(1.0);
  const auto b0 = g.frequency_buckets(0.0);
  CHECK(b1.sizes() == at::IntArrayRef({512}));
  CHECK(b1[0].item<int64_t>() == ZipfPcfg::kBosBucket);
  CHECK(head_size(b1) < head_size(b0));  // more skew, fewer tokens hold half the mass
  CHECK(head_size(b1) > 0);

  const auto stream = g.sample_tokens(200000, 1.0, 4);
  std::vector<double> freq(512, 0.0);
  for (auto t : stream) freq[t] += 1.0;
  double head_mass = 0, non_bos = 0, head_mean = 0, tail_mean = 0;
  int64_t heads = 0, tails = 0;
  const auto exact = g.token_probabilities(1.0);
  double min_head = 1, max_tail = 0;
  for (int64_t t = 1; t < 512; ++t) {
    non_bos += freq[t];
    if (b1[t].item<int64_t>() == ZipfPcfg::kHeadBucket) {
      head_mass += freq[t];
      head_mean += freq[t];
      ++heads;
      min_head = std::min(min_head, exact[t]);
    } else {
      tail_mean += freq[t];
      ++tails;
      max_tail = std::max(max_tail, exact[t]);
    }
  }
  CHECK(min_head >= max_tail);
  CHECK(head_mean / heads > 2 * tail_mean / tails);
  CHECK(head_mass / non_bos == Approx(0.5).margin(0.05));

  // Without a BOS only buckets 0 and 1 exist; tokens no preterminal emits are tail.
  ZipfPcfgOptions sparse;
  sparse.bos_token = -1;
  sparse.symbols_per_level = 4;
  sparse.emissions_per_symbol = 8;
  const ZipfPcfg s(sparse);
  const auto bs = s.frequency_buckets(0.5, 0.9);
  const auto ps = s.token_probabilities(0.5);
  int64_t bad = 0, unreachable = 0;
  for (int64_t t = 0; t < 512; ++t) {
    const auto bucket = bs[t].item<int64_t>();
    bad += bucket != ZipfPcfg::kHeadBucket && bucket != ZipfPcfg::kTailBucket;
    if (ps[t] == 0) bad += bucket != ZipfPcfg::kTailBucket, ++unreachable;
  }
  CHECK(bad == 0);
  CHECK(unreachable >= 512 - 32);
  CHECK(head_size(bs) <= 32);
  CHECK(head_size(s.frequency_buckets(0.5, 1.0)) == 32);
}

TEST_CASE("Zipf-PCFG options and arguments are checked by name", "[zipf]") {
  auto rejects = [](auto edit, const std::string& field) {
    ZipfPcfgOptions o;
    edit(o);
    CURV_CHECK_THROWS(o.validate(), InvalidArgument, Contains(field));
    CHECK_THROWS_AS(ZipfPcfg(o), InvalidArgument);
  };
  rejects([](ZipfPcfgOptions& o) { o.vocab_size = 0; }, "vocab_size = 0");
  rejects([](ZipfPcfgOptions& o) { o.depth = 0; }, "depth = 0");
  rejects([](ZipfPcfgOptions& o) { o.roots = 0; }, "roots = 0");
  rejects([](ZipfPcfgOptions& o) { o.symbols_per_level = -1; }, "symbols_per_level = -1");
  rejects([](ZipfPcfgOptions& o) { o.rules_per_symbol = 0; }, "rules_per_symbol = 0");
  rejects([](ZipfPcfgOptions& o) { o.min_children = 0; }, "min_children = 0");
  rejects([](ZipfPcfgOptions& o) { o.max_children = 1; }, "max_children = 1");
  rejects([](ZipfPcfgOptions& o) { o.emissions_per_symbol = 512; }, "emissions_per_symbol = 512");
  rejects([](ZipfPcfgOptions& o) { o.bos_token = 512; }, "bos_token = 512");
  rejects([](ZipfPcfgOptions& o) { o.exponent = -0.5; }, "exponent = -0.5");
  rejects([](ZipfPcfgOptions& o) { o.depth = 40; }, "max_children = 3 and depth = 40");

  ZipfPcfgOptions whole;  // emissions over the whole vocabulary are allowed without a BOS
  whole.bos_token = -1;
  whole.emissions_per_symbol = 512;
  CHECK_NOTHROW(whole.validate());

  const ZipfPcfg g(ZipfPcfgOptions{});
  CURV_CHECK_THROWS(g.sample_tokens(10, -1.0, 0), InvalidArgument, Contains("s = -1"));
  CURV_CHECK_THROWS(g.rule_probabilities(3, 0, 1.0), InvalidArgument, Contains("level = 3"));
  CURV_CHECK_THROWS(g.rule_probabilities(1, 16, 1.0), InvalidArgument, Contains("symbol = 16"));
  CURV_CHECK_THROWS(g.emission_tokens(16), InvalidArgument, Contains("symbol = 16"));
  CURV_CHECK_THROWS(g.frequency_buckets(1.0, 0.0), InvalidArgument, Contains("head_mass = 0"));
  CHECK_THAT(g.describe(), Contains("depth=4") && Contains("hash="));
}
