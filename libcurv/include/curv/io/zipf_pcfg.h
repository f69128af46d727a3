// Zipf-PCFG: a random probabilistic context-free grammar whose rule and emission probabilities
// follow a Zipf law of exponent s, used to make LM data with a controlled head/tail imbalance.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "curv/core/frequency_buckets.h"

namespace curv {

// The grammar has `depth` levels of symbols. Level 0 holds `roots` start symbols, levels
// 1..depth-1 hold `symbols_per_level` each. A symbol at level d < depth-1 has `rules_per_symbol`
// distinct production rules, each a tuple of min_children..max_children symbols of level d+1
// (length and children drawn uniformly). Symbols at the last level are preterminals: each emits
// one token out of its own `emissions_per_symbol` distinct tokens. The k-th ranked option of a
// symbol (rule or token) has probability ∝ k^(-s); which option holds which rank is a random
// permutation fixed with the grammar, so s changes how skewed the data are, never which grammar.
// Everything structural depends on `grammar_seed` alone.
struct ZipfPcfgOptions {
  int64_t vocab_size = 512;        // token ids are in [0, vocab_size)
  int64_t depth = 4;               // levels incl. preterminals; sentence length ~ 2.5^(depth-1)
  int64_t roots = 1;               // level-0 symbols; a sentence starts from one drawn uniformly
  int64_t symbols_per_level = 16;  // symbols at each level 1..depth-1
  int64_t rules_per_symbol = 8;    // production rules of each non-preterminal symbol
  int64_t min_children = 2;        // a rule has min_children..max_children children
  int64_t max_children = 3;
  // Tokens a preterminal can emit. They are dealt from repeatedly shuffled decks of the vocab
  // (bos_token excluded), so every token is emitted by some preterminal once
  // preterminals * emissions_per_symbol >= usable vocab; set it to the usable vocab size
  // (vocab_size - 1 with a BOS) for emissions over the whole vocabulary.
  int64_t emissions_per_symbol = 32;
  // Token placed before every sentence in a stream (a BOS/separator that never appears inside a
  // sentence); -1 concatenates sentences without one.
  int64_t bos_token = 0;
  // The training exponent s carried by a config; the sampling methods take s explicitly so one
  // grammar serves skewed training data and a balanced (s = 0) validation set.
  double exponent = 1.0;
  uint64_t grammar_seed = 0;  // fixes rules, children, emission sets and the rank permutations

  void validate() const;  // throws InvalidArgument naming the field and value
};

class ZipfPcfg {
 public:
  // Bucket ids returned by frequency_buckets().
  static constexpr int64_t kHeadBucket = curv::kHeadBucket;
  static constexpr int64_t kTailBucket = curv::kTailBucket;
  static constexpr int64_t kBosBucket = 2;  // only the bos_token, when there is one

  explicit ZipfPcfg(const ZipfPcfgOptions& options);

  const ZipfPcfgOptions& options() const { return options_; }
  int64_t num_symbols(int64_t level) const;

  // Whole sentences (each preceded by bos_token when >= 0) sampled at exponent s from `seed`
  // until at least n tokens; the same (grammar, s, seed) gives the same stream on every platform.
  std::vector<int64_t> sample_tokens(int64_t n, double s, uint64_t seed) const;
  // LM windows: the stream of sample_tokens cut into consecutive non-overlapping windows of
  // seq_len + 1; inputs = window[:-1], targets = window[1:], both (num_sequences, seq_len) int64
  // on the CPU.
  std::pair<at::Tensor, at::Tensor> sample_windows(int64_t num_sequences, int64_t seq_len, double s,
                                                   uint64_t seed) const;

  // Structure (for tests and inspection). Rules are indexed 0..rules_per_symbol-1 in the order
  // they were drawn; rank 1 is the most probable when s > 0.
  std::vector<std::vector<int64_t>> rules(int64_t level, int64_t symbol) const;
  std::vector<int64_t> rule_ranks(int64_t level, int64_t symbol) const;
  std::vector<double> rule_probabilities(int64_t level, int64_t symbol, double s) const;
  // Draws n rule choices of one symbol with the sampler generation uses; counts per rule index.
  std::vector<int64_t> sample_rule_counts(int64_t level, int64_t symbol, int64_t n, double s,
                                          uint64_t seed) const;
  // The tokens of preterminal `symbol` (at level depth-1) in emission-index order, their ranks
  // and their emission probabilities at exponent s.
  std::vector<int64_t> emission_tokens(int64_t symbol) const;
  std::vector<int64_t> emission_ranks(int64_t symbol) const;
  std::vector<double> emission_probabilities(int64_t symbol, double s) const;

  // Expected tokens per sentence at exponent s, bos_token included.
  double mean_sentence_length(double s) const;
  // Exact long-run frequency of every token id in a stream sampled at exponent s (vocab_size
  // entries summing to 1; the bos_token's is 1 / mean_sentence_length), from expected symbol
  // counts propagated down the levels: no sampling noise.
  std::vector<double> token_probabilities(double s) const;
  // Bucket per token id for per-bucket loss, (vocab_size) int64: the most frequent tokens at
  // exponent s (by token_probabilities, the BOS left out and the rest renormalised) until they
  // hold `head_mass` of the probability are kHeadBucket, the rest (never-emitted tokens
  // included) kTailBucket, the bos_token kBosBucket. Exact, so it needs no seed.
  at::Tensor frequency_buckets(double s, double head_mass = 0.5) const;

  // 64-bit digest of the structure (rules, ranks, emissions): equal digests mean the same grammar,
  // whatever exponent the data were sampled at.
  uint64_t structure_hash() const;
  std::string describe() const;

 private:
  struct Symbol {
    std::vector<std::vector<int64_t>> rules;  // children (indices into the next level)
    std::vector<int64_t> rule_ranks;          // 1-based Zipf rank of each rule
    std::vector<int64_t> tokens;              // preterminals only
    std::vector<int64_t> token_ranks;         // 1-based Zipf rank of each token
  };
  const Symbol& symbol_at(int64_t level, int64_t symbol, const char* what) const;
  const Symbol& preterminal_at(int64_t symbol) const;
  std::vector<double> preterminal_counts(double s) const;  // expected per sentence at exponent s

  ZipfPcfgOptions options_;
  std::vector<std::vector<Symbol>> levels_;
};

}  // namespace curv
