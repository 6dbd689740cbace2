// Registry entry of add_lora_embedding: vLLM's add_lora_embedding (SPEC §3.4), y[t] (+)= A[slot][id]
// @ B[slot]^T, the embedding LoRA with the adapter's extra vocabulary rows.
#include "apps/punica-bench/ops/op_kit.h"

namespace punica::bench {
namespace {

using kernels::DType;

class EmbeddingProblem final : public Problem {
 public:
  EmbeddingProblem(const Case& c, const BatchLayout& lay, const ProblemOptions& o) {
    Builder b(c, o, tensors);
    dtype = c.dtype;
    add_inputs_ = c.add_inputs;
    V_ = c.vocab;
    D_ = c.hidden;
    k_.init(c, lay, b, lay.token_slot);
    mapping_tensor = k_.meta.mapping;
    std::vector<int32_t> ids(std::size_t(k_.T));
    uint64_t key = b.key("token_ids");
    for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = int32_t(hash_below(key, t, uint64_t(V_)));
    ids_ = b.ints("token_ids", ids);
    // A^T table [L, V, r]: columns (rank index) past the true rank are padding.
    a_ = b.stacked("lora_a", dtype, k_.L, V_, k_.r, false, k_.slot_rank, 1.0f, false);
    b_ = b.stacked("lora_b", dtype, k_.L, D_, k_.r, false, k_.slot_rank, 1.0f / std::sqrt(float(std::max(1, k_.r))), false);
    W_ = D_ + kGuardCols;
    y_ = b.output("y", dtype, {k_.T, W_}, add_inputs_, k_.T, W_);
    mark_untouched(tensors[y_], k_.mapping, W_, 0, D_);
  }
  kernels::AddLoraEmbeddingArgs args(const std::vector<void*>& p) const {
    kernels::AddLoraEmbeddingArgs a;
    a.dtype = dtype; a.num_tokens = k_.T; a.token_ids = static_cast<const int32_t*>(p[ids_]);
    a.vocab_size = V_; a.embed_dim = D_; a.lora_a = p[a_]; a.lora_b = p[b_]; a.max_loras = k_.L;
    a.max_rank = k_.r; a.lora_ranks = k_.ranks(p); a.meta = k_.meta.view(p); a.y = p[y_];
    a.y_row_stride = W_; a.add_inputs = add_inputs_;
    return a;
  }
  void prepare(Backend& be, const std::vector<void*>& p) override { k_.prepare_meta(be, p); }
  void run(Backend& be, const std::vector<void*>& p) override { run_op(be, args(p)); }
  void reference(const std::vector<void*>& p, bool naive) override {
    k_.host_meta(p);
    if (naive) ref::naive::add_lora_embedding(args(p)); else ref::add_lora_embedding(args(p));
  }
  std::string plan(const KernelChoice& k) const override {
    (void)k;
    return kernels::describe_add_lora_embedding_plan(args(nulls()));  // shapes only: no pointer is read
  }
  Work work() const override {
    Work w;
    w.tokens = k_.T;
    double es = kernels::dtype_size(dtype);
    w.bytes = double(k_.T) * 4 + k_.lora_tokens_rank() * es + k_.sum_active_rank() * D_ * es +
              (add_inputs_ ? 2 : 1) * k_.lora_tokens() * D_ * es;
    w.flops = 2.0 * k_.lora_tokens_rank() * D_;
    return w;
  }
  Baseline baseline() const override {
    Baseline bl;
    bl.dense.push_back({k_.T, D_, k_.r, add_inputs_});
    bl.grouped.push_back({k_.groups(D_, 0, false), add_inputs_});
    return bl;
  }
  double rtol() const override { return default_rtol(dtype); }

 private:
  LoraCommon k_;
  bool add_inputs_;
  int64_t V_, D_, W_;
  int ids_, a_, b_, y_;
};

}  // namespace

void run_op(Backend& be, const kernels::AddLoraEmbeddingArgs& a) {
  be.exec([&](void* s) {
        kernels::launch_add_lora_embedding(a, static_cast<cudaStream_t>(s));
      },
      [&] { ref::add_lora_embedding(a); });
}

namespace {
OpSpec spec() {
  OpSpec s;
  s.name = "add_lora_embedding";
  s.order = 40;
  s.summary = "y (+)= A[slot][token id] @ B[slot]^T (embedding LoRA)";
  s.in_default_scenario = true;
  s.defaults = [](CaseContext& x) { return x.c().hidden > 0 ? std::vector<int64_t>{x.c().hidden} : std::vector<int64_t>{}; };
  s.require = [](CaseContext& x) { require_vocab(x); require_hidden(x); };
  s.applicable = [](CaseContext& x) { skip_unless_module(x, {"embedding"}); };
  s.make = [](const Case& c, const BatchLayout& l, const ProblemOptions& o) { return std::make_unique<EmbeddingProblem>(c, l, o); };
  return s;
}
const RegisterOp kRegistered{spec()};
}  // namespace

}  // namespace punica::bench
