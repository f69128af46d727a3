#include "curv/io/zipf_pcfg.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "core/splitmix.h"
#include "curv/core/error.h"

namespace curv {

namespace {

// xoshiro256** seeded through splitmix64. `stream` separates the grammar's randomness from the
// sampler's, so grammar_seed = seed = 0 still gives unrelated streams.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t x = seed;
    x = splitmix64(x) ^ stream;
    for (auto& word : s_) word = splitmix64(x);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Uniform in [0, n) by the multiply-high map; its bias (n / 2^64) is far below any test.
  int64_t below(int64_t n) {
    return static_cast<int64_t>(
        (static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(n)) >> 64);
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (int64_t i = static_cast<int64_t>(v.size()) - 1; i > 0; --i)
      std::swap(v[i], v[below(i + 1)]);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

constexpr uint64_t kGrammarStream = 0x6772616d6d617221ULL;  // "grammar!"
constexpr uint64_t kSampleStream = 0x73616d706c696e67ULL;   // "sampling"
constexpr int64_t kMaxSentenceLength = int64_t{1} << 20;

void check_exponent(double s, const char* where) {
  if (!std::isfinite(s) || s < 0) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg {}: exponent s = {} must be finite and >= 0", where, s));
  }
}

// p_i ∝ rank_i^(-s); s = 0 gives exactly uniform probabilities.
std::vector<double> zipf_probabilities(const std::vector<int64_t>& ranks, double s) {
  std::vector<double> p(ranks.size());
  double total = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    p[i] = s == 0 ? 1.0 : std::pow(static_cast<double>(ranks[i]), -s);
    total += p[i];
  }
  for (auto& x : p) x /= total;
  return p;
}

std::vector<double> cumulative(const std::vector<double>& p) {
  std::vector<double> c(p.size());
  std::partial_sum(p.begin(), p.end(), c.begin());
  return c;
}

// Index of the first cumulative value above u; the clamp covers a last entry that rounding left
// just under 1.
int64_t draw(const std::vector<double>& cdf, Rng& rng) {
  const double u = rng.uniform();
  const auto j = static_cast<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
  return std::min<int64_t>(j, static_cast<int64_t>(cdf.size()) - 1);
}

std::vector<int64_t> random_ranks(int64_t m, Rng& rng) {
  std::vector<int64_t> ranks(m);
  std::iota(ranks.begin(), ranks.end(), 1);
  rng.shuffle(ranks);
  return ranks;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Options

void ZipfPcfgOptions::validate() const {
  auto at_least = [](const char* field, int64_t value, int64_t min) {
    if (value < min) {
      throw InvalidArgument(fmt::format("zipf_pcfg: {} = {} must be >= {}", field, value, min));
    }
  };
  at_least("vocab_size", vocab_size, 1);
  at_least("depth", depth, 1);
  at_least("roots", roots, 1);
  at_least("symbols_per_level", symbols_per_level, 1);
  at_least("rules_per_symbol", rules_per_symbol, 1);
  at_least("min_children", min_children, 1);
  if (max_children < min_children) {
    throw InvalidArgument(fmt::format("zipf_pcfg: max_children = {} must be >= min_children = {}",
                                      max_children, min_children));
  }
  if (bos_token < -1 || bos_token >= vocab_size) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg: bos_token = {} must be -1 (none) or in [0, "
                    "vocab_size = {})",
                    bos_token, vocab_size));
  }
  const int64_t usable = vocab_size - (bos_token >= 0 ? 1 : 0);
  if (emissions_per_symbol < 1 || emissions_per_symbol > usable) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg: emissions_per_symbol = {} must be in [1, {}] (the "
                    "vocab_size = {} less the bos_token)",
                    emissions_per_symbol, usable, vocab_size));
  }
  if (!std::isfinite(exponent) || exponent < 0) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg: exponent = {} must be finite and >= 0", exponent));
  }
  // The longest sentence has max_children^(depth-1) tokens; refuse grammars that could not fit.
  double longest = 1;
  for (int64_t d = 1; d < depth; ++d) longest *= static_cast<double>(max_children);
  if (longest > static_cast<double>(kMaxSentenceLength)) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg: max_children = {} and depth = {} allow sentences of "
                    "{:g} tokens; keep max_children^(depth-1) <= {}",
                    max_children, depth, longest, kMaxSentenceLength));
  }
}

// ---------------------------------------------------------------------------------------------
// Grammar

ZipfPcfg::ZipfPcfg(const ZipfPcfgOptions& options) : options_(options) {
  options_.validate();
  const auto& o = options_;
  Rng rng(o.grammar_seed, kGrammarStream);
  levels_.resize(o.depth);
  for (int64_t d = 0; d < o.depth; ++d) levels_[d].resize(d == 0 ? o.roots : o.symbols_per_level);

  for (int64_t d = 0; d + 1 < o.depth; ++d) {
    const int64_t next_size = static_cast<int64_t>(levels_[d + 1].size());
    for (auto& sym : levels_[d]) {
      // Distinct rules where the space allows, so rules_per_symbol counts real alternatives;
      // a bounded number of redraws keeps tiny grammars (few symbols, one child) finite.
      std::set<std::vector<int64_t>> seen;
      for (int64_t r = 0; r < o.rules_per_symbol; ++r) {
        std::vector<int64_t> children;
        for (int attempt = 0; attempt < 64; ++attempt) {
          const int64_t n = o.min_children + rng.below(o.max_children - o.min_children + 1);
          children.resize(n);
          for (auto& c : children) c = rng.below(next_size);
          if (seen.insert(children).second) break;
        }
        sym.rules.push_back(children);
      }
      sym.rule_ranks = random_ranks(o.rules_per_symbol, rng);
    }
  }

  // Emission sets are dealt from shuffled decks of the usable vocabulary rather than drawn
  // independently, so the preterminals together cover every token before any repeats.
  std::vector<int64_t> deck;
  for (int64_t t = 0; t < o.vocab_size; ++t) {
    if (t != o.bos_token) deck.push_back(t);
  }
  size_t pos = deck.size();
  std::vector<char> taken(o.vocab_size, 0);
  for (auto& sym : levels_.back()) {
    while (static_cast<int64_t>(sym.tokens.size()) < o.emissions_per_symbol) {
      if (pos == deck.size()) {
        rng.shuffle(deck);
        pos = 0;
      }
      const int64_t t = deck[pos++];
      if (taken[t]) continue;
      taken[t] = 1;
      sym.tokens.push_back(t);
    }
    for (auto t : sym.tokens) taken[t] = 0;
    sym.token_ranks = random_ranks(o.emissions_per_symbol, rng);
  }
}

int64_t ZipfPcfg::num_symbols(int64_t level) const {
  if (level < 0 || level >= options_.depth) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg: level = {} must be in [0, depth = {})", level, options_.depth));
  }
  return static_cast<int64_t>(levels_[level].size());
}

const ZipfPcfg::Symbol& ZipfPcfg::symbol_at(int64_t level, int64_t symbol, const char* what) const {
  if (level < 0 || level + 1 >= options_.depth) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg {}: level = {} must be in [0, depth - 1 = {}): "
                    "only those levels have rules",
                    what, level, options_.depth - 1));
  }
  const auto& syms = levels_[level];
  if (symbol < 0 || symbol >= static_cast<int64_t>(syms.size())) {
    throw InvalidArgument(fmt::format("zipf_pcfg {}: symbol = {} must be in [0, {}) at level {}",
                                      what, symbol, syms.size(), level));
  }
  return syms[symbol];
}

const ZipfPcfg::Symbol& ZipfPcfg::preterminal_at(int64_t symbol) const {
  const auto& syms = levels_.back();
  if (symbol < 0 || symbol >= static_cast<int64_t>(syms.size())) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg: preterminal symbol = {} must be in [0, {})", symbol, syms.size()));
  }
  return syms[symbol];
}

std::vector<std::vector<int64_t>> ZipfPcfg::rules(int64_t level, int64_t symbol) const {
  return symbol_at(level, symbol, "rules").rules;
}

std::vector<int64_t> ZipfPcfg::rule_ranks(int64_t level, int64_t symbol) const {
  return symbol_at(level, symbol, "rule_ranks").rule_ranks;
}

std::vector<double> ZipfPcfg::rule_probabilities(int64_t level, int64_t symbol, double s) const {
  check_exponent(s, "rule_probabilities");
  return zipf_probabilities(symbol_at(level, symbol, "rule_probabilities").rule_ranks, s);
}

std::vector<int64_t> ZipfPcfg::emission_tokens(int64_t symbol) const {
  return preterminal_at(symbol).tokens;
}

std::vector<int64_t> ZipfPcfg::emission_ranks(int64_t symbol) const {
  return preterminal_at(symbol).token_ranks;
}

std::vector<double> ZipfPcfg::emission_probabilities(int64_t symbol, double s) const {
  check_exponent(s, "emission_probabilities");
  return zipf_probabilities(preterminal_at(symbol).token_ranks, s);
}

// ---------------------------------------------------------------------------------------------
// Sampling

std::vector<int64_t> ZipfPcfg::sample_rule_counts(int64_t level, int64_t symbol, int64_t n,
                                                  double s, uint64_t seed) const {
  check_exponent(s, "sample_rule_counts");
  if (n < 0)
    throw InvalidArgument(fmt::format("zipf_pcfg sample_rule_counts: n = {} must be >= 0", n));
  const auto cdf = cumulative(rule_probabilities(level, symbol, s));
  Rng rng(seed, kSampleStream);
  std::vector<int64_t> counts(cdf.size(), 0);
  for (int64_t i = 0; i < n; ++i) ++counts[draw(cdf, rng)];
  return counts;
}

std::vector<int64_t> ZipfPcfg::sample_tokens(int64_t n, double s, uint64_t seed) const {
  check_exponent(s, "sample_tokens");
  if (n < 0) throw InvalidArgument(fmt::format("zipf_pcfg sample_tokens: n = {} must be >= 0", n));
  const auto& o = options_;
  // Cumulative tables for this s, once per call: rules for inner levels, tokens for the last.
  std::vector<std::vector<std::vector<double>>> cdf(o.depth);
  for (int64_t d = 0; d < o.depth; ++d) {
    for (const auto& sym : levels_[d]) {
      const bool last = d + 1 == o.depth;
      cdf[d].push_back(cumulative(zipf_probabilities(last ? sym.token_ranks : sym.rule_ranks, s)));
    }
  }
  Rng rng(seed, kSampleStream);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n) + 64);
  std::vector<std::pair<int64_t, int64_t>> stack;  // (level, symbol), expanded leftmost first
  while (static_cast<int64_t>(out.size()) < n) {
    if (o.bos_token >= 0) out.push_back(o.bos_token);
    stack.emplace_back(0, rng.below(o.roots));
    while (!stack.empty()) {
      const auto [d, i] = stack.back();
      stack.pop_back();
      const auto& sym = levels_[d][i];
      const int64_t k = draw(cdf[d][i], rng);
      if (d + 1 == o.depth) {
        out.push_back(sym.tokens[k]);
      } else {
        const auto& children = sym.rules[k];
        for (auto c = children.rbegin(); c != children.rend(); ++c) stack.emplace_back(d + 1, *c);
      }
    }
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> ZipfPcfg::sample_windows(int64_t num_sequences, int64_t seq_len,
                                                           double s, uint64_t seed) const {
  if (num_sequences < 1) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg sample_windows: num_sequences = {} must be >= 1", num_sequences));
  }
  if (seq_len < 1) {
    throw InvalidArgument(
        fmt::format("zipf_pcfg sample_windows: seq_len = {} must be >= 1", seq_len));
  }
  const int64_t width = seq_len + 1;
  const auto tokens = sample_tokens(num_sequences * width, s, seed);
  auto windows = at::empty({num_sequences, width}, at::kLong);
  std::memcpy(windows.data_ptr<int64_t>(), tokens.data(),
              static_cast<size_t>(num_sequences * width) * sizeof(int64_t));
  return {windows.narrow(1, 0, seq_len).contiguous(), windows.narrow(1, 1, seq_len).contiguous()};
}

// ---------------------------------------------------------------------------------------------
// Exact frequencies

// Expected symbol counts per sentence flow down the levels linearly: a parent expected c times
// passes c * p(rule) to every child slot of every rule.
std::vector<double> ZipfPcfg::preterminal_counts(double s) const {
  const auto& o = options_;
  std::vector<double> counts(o.roots, 1.0 / static_cast<double>(o.roots));
  for (int64_t d = 0; d + 1 < o.depth; ++d) {
    std::vector<double> next(levels_[d + 1].size(), 0.0);
    for (size_t i = 0; i < levels_[d].size(); ++i) {
      const auto& sym = levels_[d][i];
      const auto p = zipf_probabilities(sym.rule_ranks, s);
      for (size_t r = 0; r < sym.rules.size(); ++r) {
        for (auto c : sym.rules[r]) next[c] += counts[i] * p[r];
      }
    }
    counts = std::move(next);
  }
  return counts;
}

double ZipfPcfg::mean_sentence_length(double s) const {
  check_exponent(s, "mean_sentence_length");
  const auto counts = preterminal_counts(s);
  return std::accumulate(counts.begin(), counts.end(), 0.0) + (options_.bos_token >= 0 ? 1.0 : 0.0);
}

// Sentences are i.i.d., so the long-run frequency of a token in the stream is its expected count
// per sentence over the expected sentence length (renewal-reward).
std::vector<double> ZipfPcfg::token_probabilities(double s) const {
  check_exponent(s, "token_probabilities");
  const auto counts = preterminal_counts(s);
  std::vector<double> freq(options_.vocab_size, 0.0);
  double length = options_.bos_token >= 0 ? 1.0 : 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const auto& sym = levels_.back()[i];
    const auto q = zipf_probabilities(sym.token_ranks, s);
    for (size_t k = 0; k < sym.tokens.size(); ++k) freq[sym.tokens[k]] += counts[i] * q[k];
    length += counts[i];
  }
  if (options_.bos_token >= 0) freq[options_.bos_token] = 1.0;
  for (auto& f : freq) f /= length;
  return freq;
}

at::Tensor ZipfPcfg::frequency_buckets(double s, double head_mass) const {
  check_exponent(s, "frequency_buckets");
  auto freq = token_probabilities(s);
  const int64_t bos = options_.bos_token;
  if (bos >= 0) freq[bos] = 0;  // left out of the split: its own bucket
  at::Tensor buckets = head_tail_buckets(freq, head_mass, "zipf_pcfg frequency_buckets");
  if (bos >= 0) buckets[bos] = kBosBucket;
  return buckets;
}

uint64_t ZipfPcfg::structure_hash() const {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over every structural integer, with separators
  auto add = [&](int64_t v) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (static_cast<uint64_t>(v) >> (8 * byte)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  add(options_.vocab_size);
  add(options_.bos_token);
  for (const auto& level : levels_) {
    add(-1);
    for (const auto& sym : level) {
      add(-2);
      for (const auto& rule : sym.rules) {
        add(-3);
        for (auto c : rule) add(c);
      }
      for (auto r : sym.rule_ranks) add(r);
      for (auto t : sym.tokens) add(t);
      for (auto r : sym.token_ranks) add(r);
    }
  }
  return h;
}

std::string ZipfPcfg::describe() const {
  const auto& o = options_;
  return fmt::format(
      "zipf_pcfg(vocab={}, depth={}, roots={}, symbols_per_level={}, rules_per_symbol={}, "
      "children={}..{}, emissions_per_symbol={}, bos_token={}, exponent={}, "
      "grammar_seed={}, mean_sentence_length={:.2f}, hash={:016x})",
      o.vocab_size, o.depth, o.roots, o.symbols_per_level, o.rules_per_symbol, o.min_children,
      o.max_children, o.emissions_per_symbol, o.bos_token, o.exponent, o.grammar_seed,
      mean_sentence_length(o.exponent), structure_hash());
}

}  // namespace curv
