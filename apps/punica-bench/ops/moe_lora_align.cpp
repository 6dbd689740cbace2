// Registry entry of moe_lora_align: vLLM's moe_lora_align_block_size (SPEC §4.2), per processed
// adapter slot the (token, expert) pairs grouped by local expert and padded to block_size. Checked
// by the order-free contract (ref::check_moe_lora_align: each group as a set, the sentinels, the
// per-block experts, untouched slots bit-equal), never by positions inside a group.
#include "apps/punica-bench/ops/moe_kit.h"

namespace punica::bench {
namespace {

using kernels::DType;

class AlignProblem final : public Problem {
 public:
  AlignProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    k_.init(c, lay, b);
    mapping_tensor = -1;  // the lists depend on every token: --sample-rows does not apply
    naive_ = k_.path_naive();
    const auto sz = kernels::moe_lora_align_sizes(k_.numel(), k_.Ek(), k_.cfg.block_size, false);
    P_ = sz.max_padded;
    Q_ = sz.max_blocks;
    // Poisoned outputs (vLLM allocates them uninitialised; unprocessed slots must stay as they were).
    auto poison = [&](const std::string& n, int64_t len, int32_t v) {
      return b.ints(n, std::vector<int32_t>(std::size_t(std::max<int64_t>(len, 1)), v), Role::output);
    };
    k_.sorted_idx = poison("sorted_token_ids", naive_ ? 1 : int64_t(k_.L) * P_, 0x5a5a5a5a);
    k_.eids_idx = poison("expert_ids", naive_ ? k_.numel() : int64_t(k_.L) * Q_, 0x3c3c3c3c);
    k_.ntpp_idx = poison("num_tokens_post_pad", naive_ ? 1 : k_.L, 0x77777777);
    k_.ws_bytes = std::max<std::size_t>(16, kernels::moe_lora_align_workspace_bytes(std::max<int64_t>(k_.M, 1), k_.cfg.top_k, k_.Ek(), k_.L));
    k_.ws_idx = b.scratch("align_workspace", k_.ws_bytes);
  }
  kernels::MoeLoraAlignArgs args(const std::vector<void*>& p) const {
    kernels::MoeLoraAlignArgs a = k_.align_args(p, naive_);
    a.max_padded = P_;
    return a;
  }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    if (naive) ref::naive::moe_lora_align(args(p)); else ref::moe_lora_align(args(p));
  }
  // The contract on the op's result and on the reference's (both must hold it).
  std::optional<CustomCheck> custom_check(const std::vector<const void*>& actual,
                                          const std::vector<const void*>& expected) const override {
    CustomCheck r;
    std::vector<void*> in(tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) in[i] = const_cast<void*>(expected[i]);
    const kernels::MoeLoraAlignArgs a = args(in);
    auto i32 = [](const void* v) { return static_cast<const int32_t*>(v); };
    auto before = [&](int i) { return reinterpret_cast<const int32_t*>(tensors[std::size_t(i)].data.data()); };
    for (int i : {k_.sorted_idx, k_.eids_idx, k_.ntpp_idx}) r.nelems += tensors[std::size_t(i)].numel();
    const struct { const char* who; const std::vector<const void*>& v; } sides[] = {{"op", actual}, {"reference", expected}};
    for (const auto& s : sides) {
      const std::string why = ref::check_moe_lora_align(
          a, i32(s.v[std::size_t(k_.sorted_idx)]), i32(s.v[std::size_t(k_.eids_idx)]), i32(s.v[std::size_t(k_.ntpp_idx)]),
          before(k_.sorted_idx), before(k_.eids_idx), before(k_.ntpp_idx));
      if (!why.empty()) {
        ++r.nwrong;
        r.failures.push_back(std::string(s.who) + ": " + why);
      }
    }
    return r;
  }
  std::string describe() const override {
    return "E=" + std::to_string(k_.Ek()) + " local=" + std::to_string(k_.cfg.E_local) + " top_k=" +
           std::to_string(k_.cfg.top_k) + " block_size=" + std::to_string(k_.cfg.block_size) + " P=" + std::to_string(P_) +
           " Q=" + std::to_string(Q_) + " path=" + (naive_ ? "naive" : "aligned");
  }
  std::string plan(const KernelChoice&) const override {
    return std::string("moe_lora_align ") + (naive_ ? "naive" : "aligned bs=" + std::to_string(k_.cfg.block_size));
  }
  // Floor: topk_ids and the mapping read; written: naive, expert_ids [M*k]; aligned, per processed
  // slot its padded lists (sum over local experts of the padded group sizes), their block experts and
  // num_tokens_post_pad.
  Work work() const override {
    Work w;
    w.tokens = k_.M;
    w.bytes = double(k_.numel()) * 4 + double(k_.M) * 4;
    if (naive_) {
      w.bytes += double(k_.numel()) * 4;
      return w;
    }
    std::map<std::pair<int, int>, int64_t> cnt;
    std::vector<char> processed(std::size_t(k_.L), 0);
    for (int32_t l : k_.lora_ids)
      if (l >= 0 && l < k_.L && k_.enabled[std::size_t(l)]) processed[std::size_t(l)] = 1;
    for (int64_t i = 0; i < k_.numel(); ++i) {
      const int l = k_.mapping[std::size_t(i / k_.cfg.top_k)];
      if (l >= 0 && processed[std::size_t(l)] && k_.local_expert(i) >= 0) ++cnt[{l, k_.local_expert(i)}];
    }
    const int64_t bs = k_.cfg.block_size;
    for (const auto& [le, n] : cnt) {
      const double padded = double((n + bs - 1) / bs * bs);
      w.bytes += padded * 4 + padded / double(bs) * 4;
    }
    for (char p : processed) w.bytes += p ? 4 : 0;
    return w;
  }

 private:
  MoeCommon k_;
  bool naive_;
  int64_t P_ = 0, Q_ = 0;
};

}  // namespace

void run_op(Backend& be, const kernels::MoeLoraAlignArgs& a) {
  be.exec([&](void* s) { kernels::launch_moe_lora_align(a, static_cast<cudaStream_t>(s)); },
          [&] { ref::moe_lora_align(a); });
}

namespace {
const RegisterOp kRegistered{moe_spec<AlignProblem>(
    "moe_lora_align", 100,
    "moe_lora_align_block_size: per adapter, (token, expert) pairs grouped by expert, padded to block_size",
    {"num_experts", "top_k", "expert_map", "disabled_adapters", "routing", "oob_expert_fraction", "block_size", "naive"},
    -1)};
}  // namespace

}  // namespace punica::bench
