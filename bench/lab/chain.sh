#!/usr/bin/env bash
# One chain of device runs, each step logged with its start, end and exit status.
#
#   RESULTS=/tmp/chain bash bench/lab/chain.sh STEP [STEP ...]
#
# Run it in the background (setsid) from a copy of the tree, with the wheels of
# bench/lab/README.md on PYTHONPATH, and pack $RESULTS while it runs
# (bench/lab/pack.sh).  Each step writes $RESULTS/<step>.log plus its own files;
# chain.log holds the times.  A step that outlasts STEP_TIMEOUT seconds is cut.
set -u
RESULTS=${RESULTS:-/tmp/chain}
STEP_TIMEOUT=${STEP_TIMEOUT:-900}
mkdir -p "$RESULTS"
card=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100' if 'H100' in n else 'gpu')")
commit=$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
stamp="$(date +%Y-%m-%d)-${commit}-${card}"
export BENCH_COMMIT=$commit  # bench.steps' table headers (the copy's git metadata can be older than its files)

log() { echo "$(date +%H:%M:%S) $*" >> "$RESULTS/chain.log"; }

run_step() {
  local name=$1
  shift
  log "$name"
  timeout "$STEP_TIMEOUT" "$@" > "$RESULTS/$name.log" 2>&1
  log "$name rc=$?"
}

log "start $stamp"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> "$RESULTS/chain.log" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$RESULTS/chain.log" 2>&1

for step in "$@"; do
  case $step in
    gpu_tests)
      run_step gpu_tests python3 -m pytest -q -n 8 -p no:cacheprovider tests --junitxml="$RESULTS/gpu_tests-$stamp.xml" ;;
    host_overhead)
      run_step host_overhead python3 -m bench.host_overhead --steps off ;;
    host_at_shapes-*)
      # host_at_shapes-<model>: host and wall time per norm call at the model's shapes, native against ours
      run_step "$step" python3 -m bench.host_at_shapes --model "${step#host_at_shapes-}" ;;
    host_profile-*)
      # host_profile-<op>-<forward|backward|full>: where the fast path's host time goes (cProfile, torch.profiler)
      spec=${step#host_profile-}
      run_step "$step" python3 -m bench.host_overhead --steps off --ops "${spec%-*}" --profile "${spec%-*}" \
        --profile-path fast --profile-mode "${spec##*-}" ;;
    host_steps)
      run_step host_steps python3 -m bench.host_overhead --paths native --ops group_norm --steps on ;;
    steps_eager)
      run_step steps_eager python3 -m bench.steps --modes eager --quick --rounds 5 --layout contiguous,channels_last \
        --out "$RESULTS/steps_eager" ;;
    steps_compiled)
      run_step steps_compiled python3 -m bench.steps --modes compile,reduce-overhead --quick \
        --layout contiguous,channels_last --out "$RESULTS/steps_compiled" ;;
    probe_group_norm)
      run_step probe_group_norm python3 -m bench.lab.probe_group_norm ;;
    probe_group_norm-*)
      # probe_group_norm-<i>[+<i>...]: those of its SHAPES only (6: the UNet's one-pass shape)
      idx=${step#probe_group_norm-}
      run_step "$step" python3 -m bench.lab.probe_group_norm --shapes "${idx//+/,}" ;;
    probe_nhwc)
      run_step probe_nhwc python3 -m bench.lab.probe_group_norm_nhwc --out "$RESULTS/probe_nhwc.md" ;;
    probe_nhwc_quick)
      # three nhwc variants and the team candidates' first two tiles a row (the full probe: probe_nhwc)
      run_step probe_nhwc_quick python3 -m bench.lab.probe_group_norm_nhwc --quick --out "$RESULTS/probe_nhwc_quick.md" ;;
    probe_flce_chunks)
      run_step probe_flce_chunks python3 -m bench.lab.probe_flce_chunks --out "$RESULTS/probe_flce_chunks.md" ;;
    probe_ce_warps)
      run_step probe_ce_warps python3 -m bench.lab.probe_ce_warps --out "$RESULTS/probe_ce_warps.md" ;;
    probe_glu_tiles)
      run_step probe_glu_tiles python3 -m bench.lab.probe_glu_tiles --out "$RESULTS/probe_glu_tiles.md" ;;
    probe_rms_norm_wide)
      run_step probe_rms_norm_wide python3 -m bench.lab.probe_rms_norm_wide --out "$RESULTS/probe_rms_norm_wide.md" ;;
    steps_llm)
      run_step steps_llm python3 -m bench.steps --models llama,qwen2,llama3 --modes eager,compile --quick --rounds 5 \
        --out "$RESULTS/steps_llm" ;;
    steps_llm_compiled)
      # steps_llm's compiled rows, ours against native (upstream's crash in its own loss is known)
      run_step steps_llm_compiled python3 -m bench.steps --models llama,qwen2,llama3 --modes compile \
        --providers native,liger --quick --rounds 5 --out "$RESULTS/steps_llm_compiled" ;;
    steps_llm_long)
      # the LLM steps at B2 S4096 (steps_llm's --quick runs B8 S512 for llama and qwen2)
      run_step steps_llm_long python3 -m bench.steps --models llama,qwen2 --modes eager,compile --shapes 2x4096 \
        --rounds 5 --out "$RESULTS/steps_llm_long" ;;
    steps_llm_norms_mlp-*)
      # steps_llm_norms_mlp-<B>x<S>[-<models>[-<modes>]] (commas as +): rope, the norms and the MLP from each
      # library, the loss left as is in both (the issue's same set; upstream's compiled steps crash in its loss)
      IFS=- read -r shape models modes <<< "${step#steps_llm_norms_mlp-}"
      models=${models:-llama+qwen2}
      modes=${modes:-eager+compile}
      run_step "$step" python3 -m bench.steps --models "${models//+/,}" --modes "${modes//+/,}" --shapes "$shape" \
        --rounds 5 --liger-off fused_linear_cross_entropy --upstream-off fused_linear_cross_entropy \
        --out "$RESULTS/$step" ;;
    steps_llm_compile_math)
      # compiled Llama and Qwen2 B8 S512 with our ops traced as their references' torch ops, which Inductor
      # fuses with their neighbours: what our kernels' fusion boundaries cost a compiled step
      run_step steps_llm_compile_math env CSRC_FREE_OPS_DECOMPOSE=math python3 -m bench.steps --models llama,qwen2 \
        --modes compile --providers native,liger --quick --rounds 5 --out "$RESULTS/steps_llm_compile_math" ;;
    steps_llm_off-*)
      # steps_llm_off-<keyword>[+<keyword>...]: compiled Llama, ours with those apply_liger_ops keywords off
      off=${step#steps_llm_off-}
      run_step "$step" python3 -m bench.steps --models llama --modes compile --providers native,liger --quick \
        --rounds 3 --liger-off "${off//+/,}" --out "$RESULTS/$step" ;;
    steps_llm_compile_blocking-*)
      # steps_llm_compile_blocking-<model>: ours compiled, launches synchronous, so an illegal access is
      # reported at the launch that made it (its traceback is in the log)
      run_step "$step" env CUDA_LAUNCH_BLOCKING=1 python3 -m bench.steps --models "${step#steps_llm_compile_blocking-}" \
        --modes compile --providers liger --quick --rounds 1 --out "$RESULTS/$step"
      # the Inductor module the traceback names: the failing kernel's source and its buffers' origins
      code=$(grep -o '/tmp/torchinductor_[^"]*\.py' "$RESULTS/$step.log" | tail -1)
      if [ -n "$code" ]; then mkdir -p "$RESULTS/$step" && cp "$code" "$RESULTS/$step/output_code.txt"; fi ;;
    steps_llm_memory)
      run_step steps_llm_memory python3 -m bench.steps --models llama --modes eager --quick --rounds 1 --memory-peak \
        --out "$RESULTS/steps_llm_memory" ;;
    steps_diffusion_host)
      # the eager diffusion steps with the host's side of each (launches, syncs, top self-CPU ops per step)
      run_step steps_diffusion_host python3 -m bench.steps --models resnet,unet,vae --modes eager --quick --rounds 3 \
        --layout contiguous,channels_last --host-profile --out "$RESULTS/steps_diffusion_host" ;;
    steps_unet_off-*)
      # steps_unet_off-<keyword>[+<keyword>...]: the eager UNet in both layouts, ours with those
      # apply_liger_ops keywords off (host_at_shapes-unet: layer_norm costs 1.5x native's host time there)
      off=${step#steps_unet_off-}
      run_step "$step" python3 -m bench.steps --models unet --modes eager --quick --rounds 3 \
        --layout contiguous,channels_last --host-profile --providers native,liger --liger-off "${off//+/,}" \
        --out "$RESULTS/$step" ;;
    steps_diffusion)
      run_step steps_diffusion python3 -m bench.steps --models resnet,unet --modes eager --quick --rounds 5 \
        --layout contiguous,channels_last --out "$RESULTS/steps_diffusion" ;;
    ops-*)
      # ops-<op>[+<op>...]-<set>[+<set>...]: the op table of those ops and shape sets, both timers
      local_spec=${step#ops-}
      ops=${local_spec%%-*}
      sets=${local_spec#*-}
      run_step "$step" python3 -m bench.run --ops "${ops//+/,}" --sets "${sets//+/,}" --quick --timer graph,eager \
        --no-plots --out "$RESULTS/$step" ;;
    *)
      log "unknown step $step" ;;
  esac
done
log "done"
