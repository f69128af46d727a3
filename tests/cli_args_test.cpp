// The tools' argument groups on their own: flags parsed by CLI11 into the library's options, and
// library validation errors naming the flags a user typed.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <functional>
#include <tuple>
#include <utility>

#include "cli_common.h"
#include "curv/core/blocks.h"
#include "curv/core/error.h"
#include "curv/core/hvp_method.h"
#include "curv/io/param_order.h"
#include "probe_args.h"
#include "test_support.h"

using namespace curv;
using Catch::Matchers::Contains;

namespace {

// Parses `args` (without the program name) into the groups added to `app`.
void parse(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  app.parse(args);
}

}  // namespace

TEST_CASE("options named in a library error become the flags of the argument groups", "[cli]") {
  const std::map<std::string, std::string> flags = {{"EigenOptions.bottom", "--eig-bottom"},
                                                    {"EigenOptions", "--eig-top/--eig-bottom"},
                                                    {"TraceOptions.matvecs", "--trace-hvps"}};
  const InvalidOption bottom("{0}: power iteration finds the largest",
                             {{"EigenOptions.bottom", "2"}});
  CHECK(std::string(bottom.what()) == "EigenOptions.bottom = 2: power iteration finds the largest");
  CHECK(tools::with_flag_names(bottom, flags) ==
        "--eig-bottom 2: power iteration finds the largest");
  const InvalidOption whole("{0}: top = bottom = 0 asks for nothing", {{"EigenOptions", ""}});
  CHECK(tools::with_flag_names(whole, flags) ==
        "--eig-top/--eig-bottom: top = bottom = 0 asks for nothing");
  // An option without a flag keeps the library's name; literal braces and a quoted user text
  // holding "{1}" are not placeholders.
  const InvalidOption two(
      fmt::format("{{0}} must divide {{1}} in {{{{x}}}} '{}'", InvalidOption::literal("a{1}")),
      {{"TraceOptions.matvecs", "4"}, {"WithinOptions.n_head", "6"}});
  CHECK(std::string(two.what()) ==
        "TraceOptions.matvecs = 4 must divide WithinOptions.n_head = 6 in {x} 'a{1}'");
  CHECK(tools::with_flag_names(two, flags) ==
        "--trace-hvps 4 must divide WithinOptions.n_head = 6 in {x} 'a{1}'");
  CURV_CHECK_THROWS(tools::validate_with_flags(
                        [] {
                          throw InvalidOption("{0} too small", {{"TraceOptions.matvecs", "1"}});
                        },
                        flags),
                    InvalidArgument, Contains("--trace-hvps 1 too small"));
  // Every library option a flag names is one the library's validation reports by that name.
  CURV_CHECK_THROWS(tools::validate_with_flags(
                        [] {
                          TraceOptions o;
                          o.matvecs = 1;
                          o.validate();
                        },
                        tools::SpectrumArgs::flags()),
                    InvalidArgument, Contains("--trace-hvps 1 must be >= "));
}

TEST_CASE("ndsprobe's argument groups produce the run options", "[cli]") {
  CLI::App app;
  tools::CheckpointArgs checkpoints;
  tools::DirectionArgs directions;
  tools::AuditArgs audit;
  tools::SpectrumArgs spectrum;
  tools::ProbeDataArgs data;
  checkpoints.add_to(app);
  directions.add_to(app);
  audit.add_to(app);
  spectrum.add_to(app);
  data.add_to(app);
  parse(app, {"run_a",
              "run_b",
              "--steps",
              "10:30",
              "--stride",
              "2",
              "--directions",
              "muon.whatif:match=1,lr=0.01,delta",
              "--coupling",
              "random",
              "--within",
              "--modes",
              "2",
              "--spectrum",
              "--eig-method",
              "power",
              "--trace",
              "hutchinson",
              "--data",
              "probe.safetensors",
              "--batch-size",
              "5"});
  ProbeRunOptions options;
  checkpoints.to_options(options);
  directions.to_options(options);
  audit.to_options(options, 7);
  options.spectrum = spectrum.to_options(7);
  CHECK(options.runs == std::vector<std::string>{"run_a", "run_b"});
  CHECK(options.steps.first == 10);
  CHECK(options.steps.last == 30);
  CHECK(options.steps.stride == 2);
  // CLI11 splits at every comma; key=value pieces rejoin the spec before them.
  CHECK(options.directions == std::vector<std::string>{"muon.whatif:match=1,lr=0.01", "delta"});
  CHECK(options.taylor.coupling == CouplingMode::kRandomized);
  CHECK(options.taylor.seed == 7);
  CHECK(options.within);
  CHECK(options.within_options.modes == 2);
  CHECK(options.spectrum.eigenvalues);
  CHECK(options.spectrum.trace);
  CHECK(options.spectrum.trace_options.method == TraceMethod::kHutchinson);
  // Power iteration finds the largest |λ| only: the default --eig-bottom is dropped ...
  CHECK(options.spectrum.eigen.method == EigenMethod::kPower);
  CHECK(options.spectrum.eigen.bottom == 0);
  CHECK_NOTHROW(options.spectrum.validate());
  const ProbeDataSource source = data.to_source(3);
  CHECK(source.options.batch_size == 5);
  CHECK_FALSE(source.token_file());

  // ... and a given one is an error that names the flag.
  CLI::App again;
  tools::SpectrumArgs given;
  given.add_to(again);
  parse(again, {"--spectrum", "--eig-method", "power", "--eig-bottom", "2"});
  CURV_CHECK_THROWS(tools::validate_with_flags([&] { given.to_options(0).validate(); },
                                               tools::SpectrumArgs::flags()),
                    InvalidArgument, Contains("--eig-bottom 2"));
}

TEST_CASE("a token file without window length or count names both flags", "[cli]") {
  CLI::App app;
  tools::ProbeDataArgs data;
  data.add_to(app);
  parse(app, {"--data", "train.bin"});
  CURV_CHECK_THROWS(tools::validate_with_flags([&] { data.to_source(0).validate(); },
                                               tools::ProbeDataArgs::flags()),
                    InvalidArgument, Contains("--block-size 0") && Contains("--examples 0"));
}

TEST_CASE("the memory budget flag takes bytes with binary suffixes", "[cli]") {
  using curv::tools::parse_bytes;
  CHECK(parse_bytes("0", "--max-memory") == 0);
  CHECK(parse_bytes("4000000000", "--max-memory") == 4000000000);
  CHECK(parse_bytes("5G", "--max-memory") == int64_t{5} << 30);
  CHECK(parse_bytes("1.5g", "--max-memory") == int64_t{3} << 29);
  CHECK(parse_bytes("512MiB", "--max-memory") == int64_t{512} << 20);
  CHECK(parse_bytes("2T", "--max-memory") == int64_t{2} << 40);
  for (const char* bad : {"", "-1G", "5X", "1e9", "G", "5 G B x"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_bytes(bad, "--max-memory"),
                      Catch::Contains("--max-memory") && Catch::Contains("K, M, G or T"));
  }
  curv::tools::EngineArgs args;
  args.max_memory = "6G";
  CHECK(args.to_options().max_memory == int64_t{6} << 30);
}

TEST_CASE("libcurv's messages name options, which ndsprobe writes as its flags", "[cli]") {
  const tools::FlagNames flags = tools::probe_flag_names();
  // The message `body` throws, as the library writes it and as ndsprobe does.
  const auto messages = [&](const std::function<void()>& body) {
    try {
      body();
    } catch (const Error& e) {
      return std::make_pair(std::string(e.what()), tools::with_flag_names(e, flags));
    }
    FAIL("no error");
    return std::make_pair(std::string(), std::string());
  };
  auto [library, tool] = messages([] { parse_param_order("moded"); });
  CHECK_THAT(library, Catch::StartsWith("ParamOrderSpec = 'moded': expected auto, model"));
  CHECK_THAT(tool, Catch::StartsWith("--param-order 'moded': expected auto, model"));
  std::tie(library, tool) = messages([] { NdsPairSpec::parse("delta"); });
  CHECK_THAT(library, Catch::StartsWith("ProbeRunOptions.comparisons = 'delta': expected A:B"));
  CHECK_THAT(tool, Catch::StartsWith("--compare 'delta': expected A:B"));
  std::tie(library, tool) = messages([] { TokenBucketOptions::parse("tails"); });
  CHECK_THAT(tool, Catch::StartsWith("--token-buckets 'tails': expected head"));
  std::tie(library, tool) = messages([] { BlockPartition::parse_rule("layers"); });
  CHECK_THAT(tool, Catch::StartsWith("--blocks 'layers': expected layer"));
  std::tie(library, tool) = messages([] { parse_hvp_method("approx"); });
  CHECK_THAT(library, Catch::StartsWith("EngineOptions.hvp_method = approx"));
  CHECK_THAT(tool, Catch::StartsWith("--hvp approx: expected exact or fd"));
  std::tie(library, tool) = messages([] { ProbeDataSource{}.validate(); });
  CHECK(tool == "no probe data: --data names no file (FILE.safetensors or FILE.bin)");
  std::tie(library, tool) = messages([] { ProbeRunOptions{}.validate(); });
  CHECK(library == "no checkpoint directory given: ProbeRunOptions.runs is empty");
  CHECK(tool == "no checkpoint directory given: CHECKPOINTS is empty");
  // A message built on another keeps naming its options (the engine's out-of-memory message
  // wrapped with the unit that failed).
  const OutOfMemory inner("ran out: lower {0}", {{"EngineOptions.micro_batch", ""}});
  const OutOfMemory outer("unit: " + inner.text() + " or resume with {1}",
                          {inner.options()[0], {"ProbeJob.resume", ""}});
  CHECK(tools::with_flag_names(outer, flags) ==
        "unit: ran out: lower --micro-batch or resume with --resume");
  CHECK(Error("a {plain} message").text() == "a {{plain}} message");
}
