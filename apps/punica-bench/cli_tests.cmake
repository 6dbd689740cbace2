# CLI-level tests of punica-bench: exit codes, bad input, MPI runs with 2 and 4 ranks, faults.
set(PB $<TARGET_FILE:punica-bench>)
set(EXPECT ${CMAKE_SOURCE_DIR}/scripts/expect_exit.sh)
set(TD ${CMAKE_CURRENT_SOURCE_DIR}/testdata)
set(SC ${CMAKE_SOURCE_DIR}/scenarios)
set(TMPD ${CMAKE_BINARY_DIR}/cli_test_tmp)
file(MAKE_DIRECTORY ${TMPD})
find_program(MPIEXEC_BIN NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
# Root (CI) needs --allow-run-as-root; --oversubscribe runs more ranks than the 2 cores.
set(MPIRUN ${MPIEXEC_BIN} --allow-run-as-root --oversubscribe --bind-to none)

function(pb_test name)
  add_test(NAME ${name} COMMAND ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS cli TIMEOUT 600)
endfunction()

pb_test(cli_help ${EXPECT} 0 "Subcommands" -- ${PB} --help)
pb_test(cli_run_help ${EXPECT} 0 "--sample-rows" -- ${PB} run --help)
pb_test(cli_no_subcommand ${EXPECT} 2 - -- ${PB})
pb_test(cli_bad_flag ${EXPECT} 2 - -- ${PB} run --no-such-flag)
pb_test(cli_info ${EXPECT} 0 "ops:" -- ${PB} info)
# A case too large for the backend's memory is a skip with the bytes, before any work (exit 4: nothing ran).
pb_test(bad_input_too_large ${EXPECT} 4 "needs ~[0-9.]+ GB of host memory, [0-9.]+ GB available" --
        ${PB} check --backend cpu ${TD}/too_large.json)
set_tests_properties(bad_input_too_large PROPERTIES TIMEOUT 20)
# The committed scenario schema is `punica-bench schema`'s output (generated from the registry).
pb_test(cli_schema_committed sh -c "\"$1\" schema | diff -u \"$2\" - && echo schema-ok" sh ${PB}
        ${SC}/schema/scenario.schema.json)
pb_test(cli_version ${EXPECT} 0 "punica-bench [0-9]+[.][0-9]+[.][0-9]+ [(]git [0-9a-f]+" -- ${PB} --version)
pb_test(cli_run_default ${EXPECT} 0 "# cases [0-9]+: pass [0-9]+, fail 0, skip 0, error 0" -- ${PB} run --backend cpu)
pb_test(cli_list_default ${EXPECT} 0 "lora_shrink" -- ${PB} list)
file(GLOB PB_SCENARIOS ${SC}/*.json)
pb_test(cli_validate_all ${EXPECT} 0 "ok" -- ${PB} validate ${PB_SCENARIOS})
pb_test(cli_check_smoke_cpu ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" -- ${PB} check --backend cpu -q ${SC}/smoke.json)
pb_test(cli_check_ci_plan_reach_cpu ${EXPECT} 0 "fail 0, skip 0, error 0" -- ${PB} check --backend cpu -q --sample-rows 32 ${SC}/ci_plan_reach.json)
pb_test(cli_check_ci_kernel_grid_cpu ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" -- ${PB} check --backend cpu -q ${SC}/ci_kernel_grid.json)
# MoE LoRA ops (issue 44): every op and path of ci_moe.json on the CPU backend (under a second), and
# under mpirun -np 2 (every rank checks every case; wrong counts summed).
pb_test(cli_check_ci_moe_cpu ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" -- ${PB} check --backend cpu -q ${SC}/ci_moe.json)
if(MPIEXEC_BIN)
  pb_test(mpi_check_ci_moe_np2 ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" --
          ${MPIRUN} -np 2 ${PB} check --backend cpu -q ${SC}/ci_moe.json)
endif()
# FlashInfer's MoE LoRA deltas (issue 45): every mode, dtype and edge of ci_moe_delta.json on the CPU
# backend (Eigen against the fp64 loops), plain, with NaN padding past the true ranks, and exact.
pb_test(cli_check_ci_moe_delta_cpu ${EXPECT} 0 "fail 0, skip 0, error 0" -- ${PB} check --backend cpu -q ${SC}/ci_moe_delta.json)
pb_test(cli_check_ci_moe_delta_nan_cpu ${EXPECT} 0 "fail 0, skip 0, error 0" --
        ${PB} check --backend cpu -q --nan-padding ${SC}/ci_moe_delta.json)
pb_test(cli_check_ci_moe_delta_exact_cpu ${EXPECT} 0 "fail 0, skip 0, error 0" --
        ${PB} check --backend cpu -q --exact ${SC}/ci_moe_delta.json)
pb_test(cli_check_nan_padding_cpu ${EXPECT} 0 "fail 0" -- ${PB} check --backend cpu -q --nan-padding ${TD}/good_tiny.json)
pb_test(cli_check_exact_cpu ${EXPECT} 0 "fail 0" -- ${PB} check --backend cpu -q --exact ${TD}/good_tiny.json)
pb_test(cli_check_sample_rows_cpu ${EXPECT} 0 "fail 0" -- ${PB} check --backend cpu -q --sample-rows 2 ${TD}/good_tiny.json)
pb_test(cli_axis_override ${EXPECT} 0 "dtype=fp16" -- ${PB} list -a dtype=fp16 ${TD}/good_tiny.json)
pb_test(cli_print_repro ${EXPECT} 0 "repro: punica-bench check" -- ${PB} check --backend cpu --print-repro ${TD}/good_tiny.json)
pb_test(cli_dump_all ${EXPECT} 0 "fail 0" -- ${PB} check --backend cpu -q --dump ${TMPD}/dump --dump-all -f linear ${TD}/good_tiny.json)
# GPU: the CUDA backend on the smoke scenario (skipped without a GPU).
add_test(NAME gpu_check_smoke_cuda COMMAND ${PB} check --backend cuda -q ${SC}/smoke.json)
set_tests_properties(gpu_check_smoke_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 4 TIMEOUT 600)
# --kernel on the CUDA backend: a forced shrink and expand kind checked against the reference.
add_test(NAME gpu_check_smoke_kernel_choice COMMAND ${PB} check --backend cuda -q --nan-padding --kernel shrink=fused_wk
         --kernel expand=pipe -f "lora_(shrink|expand)" ${SC}/smoke.json)
set_tests_properties(gpu_check_smoke_kernel_choice PROPERTIES LABELS gpu SKIP_RETURN_CODE 4 TIMEOUT 600)

# Result files: write (atomically), refuse to overwrite, export, compare.
add_test(NAME cli_results_roundtrip COMMAND bash -c "
  set -e; rm -f ${TMPD}/a.json ${TMPD}/g.json
  ${PB} run --backend cpu -q --iters 3 -o ${TMPD}/a.json ${TD}/good_tiny.json > /dev/null
  # every timed case says whether its launches waited behind a hold: never on the CPU backend
  test \$(grep -c '\"launches_held\": false' ${TMPD}/a.json) -eq \$(grep -c '\"time_us\"' ${TMPD}/a.json)
  if grep -q '\"launches_held\": true' ${TMPD}/a.json; then echo 'a CPU case says held'; exit 1; fi
  ${EXPECT} 2 'already exists' -- ${PB} run --backend cpu -q -o ${TMPD}/a.json ${TD}/good_tiny.json
  ${PB} export ${TMPD}/a.json --format gbench -o ${TMPD}/g.json
  grep -q '\"benchmarks\"' ${TMPD}/g.json
  ${PB} export ${TMPD}/a.json --format csv | grep -q '^id,op,status'
  ${PB} export ${TMPD}/a.json --format md | grep -q '^| id'
  ${PB} export ${TMPD}/a.json --format bmf | grep -q latency
  ${PB} export ${TMPD}/a.json --format gha-time | grep -q unit
  ${PB} compare ${TMPD}/a.json ${TMPD}/a.json --threshold 1000 | grep -q 'regressions 0'
  ${EXPECT} 2 'schema' -- ${PB} compare ${TMPD}/g.json ${TMPD}/a.json
")
set_tests_properties(cli_results_roundtrip PROPERTIES LABELS cli TIMEOUT 300)

# The issues' targets over result files: a synthetic result with one missed target (exit 0, or 3 with
# --strict), its JSON report written atomically, a file that is not a result (2), an unknown target
# name (2), and the committed H200 bench and layer results (parse and evaluate; by token count too).
add_test(NAME cli_targets COMMAND bash -c "
  set -e; rm -f ${TMPD}/t.json
  ${EXPECT} 0 'targets met in 4 of 5' -- ${PB} targets ${TD}/targets_sample.json
  ${EXPECT} 3 'missed dense_prefill  s/lora_expand/x=1: copy fraction 0.500 < 0.750' -- ${PB} targets --strict --list-missed ${TD}/targets_sample.json
  ${PB} targets -t dense_prefill --json ${TMPD}/t.json ${TD}/targets_sample.json > /dev/null
  grep -q 'punica-bench.targets/1' ${TMPD}/t.json
  ${EXPECT} 2 'already exists' -- ${PB} targets --json ${TMPD}/t.json ${TD}/targets_sample.json
  ${EXPECT} 2 'schema' -- ${PB} targets ${SC}/smoke.json
  ${EXPECT} 2 'not in' -- ${PB} targets -t nope ${TD}/targets_sample.json
  ${EXPECT} 0 'decode_gather' -- ${PB} targets ${CMAKE_SOURCE_DIR}/results/h200/bench_lora_ops.json ${CMAKE_SOURCE_DIR}/results/h200x2/layers_llama_decode_np2.json
  ${EXPECT} 0 'dense_prefill +lora_shrink T=8192 +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+-[0-9.]+' -- ${PB} targets --by-tokens -t dense_prefill ${CMAKE_SOURCE_DIR}/results/h200/bench_lora_ops.json
  ${EXPECT} 0 'moe_vs_cublas +add_lora_w13' -- ${PB} targets -t moe_vs_cublas ${CMAKE_SOURCE_DIR}/results/h200/bench_moe_decode.json ${CMAKE_SOURCE_DIR}/results/h200/bench_moe_prefill.json
")
set_tests_properties(cli_targets PROPERTIES LABELS cli TIMEOUT 120)

# Bad input: exit 2, a message naming the file, the JSON path / field and what was expected.
foreach(pair
    "not_json::not_json.json: .*(JSON|parse)"
    "binary::binary.json: "
    "empty::empty.json: "
    "truncated::truncated.json: "
    "top_level_array::top_level_array.json: .*object"
    "schema_version::schema_version.json: .*schema"
    "unknown_key::unknown_key.json: .*rnak"
    "wrong_type::wrong_type.json: .*max_rank"
    "negative_size::negative_size.json: .*num_requests"
    "zero_hidden::zero_hidden.json: .*hidden"
    "zero_rank::zero_rank.json: .*rank"
    "rank_gt_max::rank_gt_max.json: .*(max_rank|rank)"
    "adapters_gt_slots::adapters_gt_slots.json: .*(num_adapters|max_loras)"
    "unknown_op::unknown_op.json: .*op"
    "unknown_model::unknown_model.json: .*model"
    "unknown_dtype::unknown_dtype.json: .*dtype")
  string(REPLACE "::" ";" parts "${pair}")
  list(GET parts 0 nm)
  list(GET parts 1 rx)
  pb_test(bad_input_${nm} ${EXPECT} 2 "${rx}" -- ${PB} check --backend cpu -o ${TMPD}/never_${nm}.json ${TD}/bad/${nm}.json)
  pb_test(bad_input_validate_${nm} ${EXPECT} 2 "${rx}" -- ${PB} validate ${TD}/bad/${nm}.json)
endforeach()
pb_test(bad_input_missing_file ${EXPECT} 2 "no_such_file.json" -- ${PB} check --backend cpu ${TD}/no_such_file.json)
pb_test(bad_input_filter_matches_nothing ${EXPECT} 2 "matches no case" -- ${PB} check --backend cpu -f zzz_nothing ${TD}/good_tiny.json)
pb_test(bad_input_bad_regex ${EXPECT} 2 "regular expression" -- ${PB} list -f "(" ${TD}/good_tiny.json)
pb_test(bad_input_axis_unknown ${EXPECT} 2 "rnak" -- ${PB} list -a rnak=3 ${TD}/good_tiny.json)
pb_test(bad_input_backend ${EXPECT} 2 - -- ${PB} check --backend tpu ${TD}/good_tiny.json)
# --kernel: an unknown kind names the ones expected; the cpu backend has no kernels to choose.
pb_test(bad_input_kernel_kind ${EXPECT} 2 "unknown shrink kernel 'fused_xx' [(]expected one of auto, legacy" --
        ${PB} check --backend cpu --kernel shrink=fused_xx ${TD}/good_tiny.json)
pb_test(bad_input_kernel_op ${EXPECT} 2 "expected shrink=KIND or expand=KIND" -- ${PB} check --backend cpu --kernel linear=pipe ${TD}/good_tiny.json)
pb_test(bad_input_kernel_cpu ${EXPECT} 2 "the cpu backend has no kernels to choose" --
        ${PB} check --backend cpu --kernel expand=pipe ${TD}/good_tiny.json)
pb_test(bad_input_output_exists ${EXPECT} 2 "already exists" -- ${PB} check --backend cpu -o ${CMAKE_SOURCE_DIR}/README.md ${TD}/good_tiny.json)
pb_test(bad_input_no_result_written ${EXPECT} 0 - -- bash -c "! ls ${TMPD}/never_*.json 2>/dev/null")
set_tests_properties(bad_input_no_result_written PROPERTIES DEPENDS "bad_input_not_json;bad_input_unknown_key;bad_input_truncated")

# MPI: the CPU backend under mpirun with 2 and 4 ranks; only rank 0 prints and writes.
if(MPIEXEC_BIN)
  foreach(np 2 4)
    pb_test(mpi_check_smoke_np${np} ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" --
            ${MPIRUN} -np ${np} ${PB} check --backend cpu -q ${SC}/smoke.json)
    pb_test(mpi_run_default_np${np} ${EXPECT} 0 "ranks ${np}" -- ${MPIRUN} -np ${np} ${PB} run --backend cpu -q --iters 3)
  endforeach()
  # A rank that throws takes every rank down with its message (exit 6), never a hang.
  pb_test(mpi_fault_throw_np2 ${EXPECT} 6 "rank 1/2.*injected fault" --
          ${MPIRUN} -np 2 ${PB} check --backend cpu --inject-fault 1:throw ${TD}/good_tiny.json)
  # A rank that hangs: --timeout aborts every rank with exit 5 (test timeout 20 s).
  pb_test(mpi_fault_hang_np2 ${EXPECT} 5 "timeout" --
          ${MPIRUN} -np 2 ${PB} check --backend cpu --timeout 2 --inject-fault 0:hang ${TD}/good_tiny.json)
  set_tests_properties(mpi_fault_hang_np2 mpi_fault_throw_np2 PROPERTIES TIMEOUT 20)
endif()

# TP LoRA layers (issue 4): every layer, plain and fully sharded, written once against Backend, on
# the CPU backend: one process (tp > 1 cases skip), then mpirun -np 2/4/8 (the real slicing,
# offsets and MPI collectives; wrong counts summed over ranks). About 6 s / 9 s / 25 s / 46 s on 2 idle cores.
pb_test(cli_check_ci_layers_cpu ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" -- ${PB} check --backend cpu -q ${SC}/ci_layers.json ${SC}/ci_layers_edge.json)
if(MPIEXEC_BIN)
  foreach(np 2 4 8)
    pb_test(mpi_check_ci_layers_np${np} ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" --
            ${MPIRUN} -np ${np} ${PB} check --backend cpu -q ${SC}/ci_layers.json ${SC}/ci_layers_edge.json)
  endforeach()
  set_tests_properties(mpi_check_ci_layers_np8 PROPERTIES TIMEOUT 900)
  # NaN past each adapter's true rank (the fully-sharded A shards' true ranks) and --sample-rows
  # (the layer reference computes only the sampled rows; -1 rows keep their base output).
  pb_test(mpi_check_ci_layers_nan_padding_sample_rows_np4 ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" --
          ${MPIRUN} -np 4 ${PB} check --backend cpu -q --nan-padding --sample-rows 5 -f tiny_decode ${SC}/ci_layers.json ${SC}/ci_layers_edge.json)
endif()

# The MoE LoRA layer (issue 46, layer fused_moe): ci_moe_layer.json (TP plain and fully sharded, EP
# with and without the rank-local token subset, 3-D and non-gated w13, shared LoRA) in one process,
# then mpirun -np 2/4 (a few seconds each on 2 cores), with NaN padding and --sample-rows, and a
# timed run whose result has the layer fields. Each --inject-fault RANK:moe_* sharding bug fails the
# check (exit 1) on the cases it breaks.
pb_test(cli_check_ci_moe_layer_cpu ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" -- ${PB} check --backend cpu -q ${SC}/ci_moe_layer.json)
if(MPIEXEC_BIN)
  foreach(np 2 4)
    pb_test(mpi_check_ci_moe_layer_np${np} ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" --
            ${MPIRUN} -np ${np} ${PB} check --backend cpu -q ${SC}/ci_moe_layer.json)
  endforeach()
  pb_test(mpi_check_ci_moe_layer_nan_padding_sample_rows_np4 ${EXPECT} 0 "fail 0, skip [0-9]+, error 0" --
          ${MPIRUN} -np 4 ${PB} check --backend cpu -q --nan-padding --sample-rows 5 ${SC}/ci_moe_layer.json)
  pb_test(mpi_run_ci_moe_layer_np2 sh -c "\"$@\" && grep -q '\"lora_overhead_pct\"' \"$0\" && grep -q '\"base_gemm_tflops\"' \"$0\" && grep -q '\"algbw_gb_per_s\"' \"$0\" && echo moe-layer-fields-ok"
          ${TMPD}/moe_layer_np2.json ${MPIRUN} -np 2 ${PB} run --backend cpu -q --iters 2 --warmup 1 -f "^(tp|ep)/"
          -o ${TMPD}/moe_layer_np2.json --overwrite ${SC}/ci_moe_layer.json)
  foreach(fault "1:moe_expert_map;^ep/" "1:moe_w2_weight_twice;^tp/" "0:moe_w2_lora_unweighted;^tp/"
                "1:moe_gather_order;fully_sharded=1" "1:moe_w2_offset;fully_sharded=1" "1:moe_b_slice;^tp/.*fully_sharded=0")
    list(GET fault 0 spec)
    list(GET fault 1 filter)
    string(REGEX REPLACE "^[0-9]+:" "" kind ${spec})
    pb_test(mpi_fault_${kind}_np2 ${EXPECT} 1 "fail [1-9][0-9]*, skip [0-9]+, error 0" --
            ${MPIRUN} -np 2 ${PB} check --backend cpu -q --inject-fault ${spec} -f ${filter} ${SC}/ci_moe_layer.json)
  endforeach()
endif()

# Issue 43: limits checked before any work, option ranges, messages, compare, exports.
function(pb_bash name script)  # a bash script as one argument (its ';' kept)
  add_test(NAME ${name} COMMAND bash -c "${script}")
  set_tests_properties(${name} PROPERTIES LABELS cli TIMEOUT 120)
endfunction()
# The output path first (exit 2, and no case has run: no "RUN" progress line).
foreach(pair
    "missing_dir::/nonexistent_dir/x.json::the folder /nonexistent_dir does not exist"
    "dir::${TMPD}::is a directory"
    "parent_is_file::${CMAKE_SOURCE_DIR}/README.md/x.json::is not a folder"
    "unwritable_dir::/proc/x.json::cannot write in the folder /proc")
  string(REPLACE "::" ";" parts "${pair}")
  list(GET parts 0 nm)
  list(GET parts 1 path)
  list(GET parts 2 rx)
  pb_bash(bad_output_${nm} "
    ${EXPECT} 2 '${rx}' -- ${PB} check --backend cpu -o ${path} ${TD}/good_tiny.json > ${TMPD}/bad_output_${nm}.log || exit 1
    if grep -q 'RUN' ${TMPD}/bad_output_${nm}.log; then echo 'a case ran before the output was checked'; exit 1; fi")
endforeach()
pb_test(bad_output_dir_overwrite ${EXPECT} 2 "is a directory" -- ${PB} check --backend cpu --overwrite -o ${TMPD} ${TD}/good_tiny.json)
pb_bash(bad_output_exists_before_work "
  ${EXPECT} 2 'already exists' -- ${PB} check --backend cpu -o ${CMAKE_SOURCE_DIR}/README.md ${TD}/good_tiny.json > ${TMPD}/bad_output_exists.log || exit 1
  if grep -q 'RUN' ${TMPD}/bad_output_exists.log; then echo 'a case ran before the output was checked'; exit 1; fi")
# Option values out of range: exit 2 at parse time, naming the option.
foreach(pair
    "iters_negative::run --iters -3::--iters: expected an integer >= 1"
    "iters_zero::run --iters 0::--iters: expected an integer >= 1"
    "warmup_negative::run --warmup -1::--warmup: expected an integer >= 0"
    "sample_rows_negative::check --sample-rows -1::--sample-rows: expected an integer >= 0"
    "timeout_negative::check --timeout -1::--timeout: expected a number >= 0"
    "timeout_nan::check --timeout nan::--timeout: expected a number >= 0"
    "seed_negative::check --seed -5::--seed: expected an integer >= 0"
    "dump_all_without_dump::check --dump-all::--dump-all requires --dump")
  string(REPLACE "::" ";" parts "${pair}")
  list(GET parts 0 nm)
  list(GET parts 1 args)
  list(GET parts 2 rx)
  separate_arguments(args)
  pb_test(bad_option_${nm} ${EXPECT} 2 "${rx}" -- ${PB} ${args} --backend cpu ${TD}/good_tiny.json)
endforeach()
pb_test(cli_timeout_zero_is_off ${EXPECT} 0 "fail 0" -- ${PB} check --backend cpu -q --timeout 0 ${TD}/good_tiny.json)
# Messages: a mistyped command, a directory or a missing file as the scenario.
pb_test(bad_command_typo ${EXPECT} 2 "unknown command 'chek': did you mean check[?]" -- ${PB} chek)
pb_test(bad_input_directory ${EXPECT} 2 "testdata: is a directory" -- ${PB} check --backend cpu ${TD})
pb_test(bad_input_validate_directory ${EXPECT} 2 "testdata: is a directory" -- ${PB} validate ${TD})
pb_test(bad_input_missing_file_reason ${EXPECT} 2 "cannot open .*no_such_file.json: No such file or directory" --
        ${PB} check --backend cpu ${TD}/no_such_file.json)
# compare: matched / missing / extra, like for like (backend, GPU model, timing mode), noise, --threshold.
set(CMPD ${TD}/compare)
pb_test(cli_compare_noise_is_same ${EXPECT} 0 "within noise 1" -- ${PB} compare ${CMPD}/base.json ${CMPD}/noise.json)
pb_test(cli_compare_slower_past_noise ${EXPECT} 3 "SLOWER +50 +60 +20 +4 " -- ${PB} compare ${CMPD}/base.json ${CMPD}/slower.json)
pb_test(cli_compare_min_effect ${EXPECT} 0 "regressions 0" -- ${PB} compare --min-effect 25 ${CMPD}/base.json ${CMPD}/slower.json)
pb_test(cli_compare_missing_extra ${EXPECT} 0 "matched 1 of .*3 cases. missing from .* 2, extra in .* 1" --
        ${PB} compare ${CMPD}/base.json ${CMPD}/subset.json)
pb_test(cli_compare_other_gpu ${EXPECT} 2 "not like for like .*devices 'NVIDIA H200' vs 'NVIDIA H100" --
        ${PB} compare ${CMPD}/base.json ${CMPD}/h100.json)
pb_test(cli_compare_other_gpu_allowed ${EXPECT} 0 "WARNING: not like for like" --
        ${PB} compare --allow-mismatch ${CMPD}/base.json ${CMPD}/h100.json)
pb_test(cli_compare_other_backend ${EXPECT} 2 "backend cuda vs cpu" -- ${PB} compare ${CMPD}/base.json ${CMPD}/cpu.json)
pb_test(cli_compare_threshold_negative ${EXPECT} 2 "--threshold: expected a number >= 0" --
        ${PB} compare --threshold -5 ${CMPD}/base.json ${CMPD}/base.json)
pb_test(cli_compare_threshold_nan ${EXPECT} 2 "--threshold: expected a number >= 0" --
        ${PB} compare --threshold nan ${CMPD}/base.json ${CMPD}/base.json)
# a `check` result (no timings) against a timed one: refused, never every row "same"; exports of it refused;
# targets on a CPU result warn on stderr
pb_bash(cli_check_result_not_timed "
  set -e; rm -f ${TMPD}/untimed.json ${TMPD}/timed.json
  ${PB} check --backend cpu -q -o ${TMPD}/untimed.json ${TD}/good_tiny.json > /dev/null
  ${PB} run --backend cpu -q --iters 3 -o ${TMPD}/timed.json ${TD}/good_tiny.json > /dev/null
  ${EXPECT} 2 'timing: .*untimed.json has no timings' -- ${PB} compare ${TMPD}/untimed.json ${TMPD}/timed.json
  ${EXPECT} 0 'statuses compared only' -- ${PB} compare --allow-mismatch ${TMPD}/untimed.json ${TMPD}/timed.json
  for f in gha-time gha-throughput bmf gbench; do
    ${EXPECT} 2 'untimed.json: no (passing )?timed case .*nothing to export as '\$f -- ${PB} export ${TMPD}/untimed.json --format \$f
  done
  ${PB} export ${TMPD}/untimed.json --format csv | grep -q '^id,op,status'
  ${PB} targets ${TMPD}/timed.json 2>&1 >/dev/null | grep -q 'cpu-backend result: the targets are GPU targets'
")
# A rank stopped with SIGSTOP under --timeout 15: exit 5 within 25 s, naming the case and rank 1.
if(MPIEXEC_BIN)
  pb_test(mpi_fault_sigstop_np2 ${CMAKE_SOURCE_DIR}/scripts/mpi_sigstop_test.sh 15 ${PB} ${SC}/ci_layers.json ${MPIRUN})
  set_tests_properties(mpi_fault_sigstop_np2 PROPERTIES TIMEOUT 60)
  # under mpirun the writer (rank 0) checks the output path before MPI starts: exit 2, never a hang
  pb_test(mpi_bad_output_np2 ${EXPECT} 2 "the folder /nonexistent_dir does not exist" --
          ${MPIRUN} -np 2 ${PB} check --backend cpu -o /nonexistent_dir/x.json ${TD}/good_tiny.json)
  set_tests_properties(mpi_bad_output_np2 PROPERTIES TIMEOUT 30)
endif()
