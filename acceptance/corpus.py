"""The acceptance corpus: every target ropecheck ships (built-ins and adapters), the
project's test kernels (tests/*_kernels.py, tests/mutants.py) and the kernels of
acceptance/kernels/, each with the flags a user gives it. ``run.py`` checks every entry with
``--profile ci`` (derandomized) and records its verdict per property x dtype x mode;
``run.py --compare`` says what changed against the committed ``verdicts.json``.

An entry: name -> the ``ropecheck`` arguments after ``check`` (or ``identify``)."""

HALF = ["--layout", "half"]
QK = ["--call", "qk", "--layout", "half"]
PACKED = ["--call", "packed", "--layout", "half"]
F32 = ["--dtype", "float32"]
F32_BF16 = ["--dtype", "float32", "--dtype", "bfloat16"]

BUILTINS = ["rotate-half", "llama-complex", "matrix", "cached"]
TRITON = ["triton", "triton-interleaved", "triton-qk", "triton-packed"]
ADAPTERS = [
    "hf-llama", "hf-llama-linear", "hf-llama-dynamic", "hf-llama-yarn", "hf-llama-llama3", "hf-llama-qk",
    "hf-phi3-longrope", "hf-gpt-neox", "hf-gptj", "torchtune-rope", "torchtune-llama3-scaled",
    "rotary-embedding-torch", "rotary-embedding-torch-positions", "x-transformers", "megatron-core",
    "megatron-core-packed", "megatron-core-interleaved", "megatron-core-interleaved-packed", "timm",
    "liger-kernel", "flash-attn-rotary", "flash-attn-rotary-inplace", "flash-attn-rotary-offsets",
    "flash-attn-rotary-interleaved", "flash-attn-rotary-interleaved-inplace",
    "flash-attn-rotary-interleaved-offsets", "timm-rope-cat", "timm-rope-mixed",
    "rotary-embedding-torch-axial", "rotary-embedding-torch-axial-offsets", "hf-qwen2vl-mrope",
    "hf-qwen2vl-rope-index", "hf-qwen2vl-mrope-qk", "hf-qwen3vl-mrope", "rotary-embedding-torch-xpos",
    "x-transformers-xpos", "hf-apply-rotary-pos-emb", "liger-rotary-pos-emb", "flash-attn-apply-rotary-emb",
    "megatron-core-apply-rotary-pos-emb", "megatron-core-apply-rotary-pos-emb-packed",
    # image and video RoPE: diffusers' models and the vision encoders at their configurations
    "diffusers-flux-rope", "diffusers-flux2-rope", "diffusers-hunyuan-video-rope", "diffusers-wan-rope",
    "diffusers-cogvideox-rope", "diffusers-cogvideox15-rope", "diffusers-qwenimage-rope", "diffusers-cosmos-rope",
    "diffusers-ltx-video-rope", "diffusers-apply-rotary-emb", "diffusers-apply-rotary-emb-half",
    "hf-qwen25vl-vision-rope", "hf-pixtral-rope", "timm-eva02-rope", "timm-dinov3-rope",
]
MUTANTS = [
    "sign_flipped", "interleaved_pairs", "wrong_base", "off_by_one", "positions_ignored",
    "first_row_positions", "angles_in_bf16", "positions_in_fp16", "cos_sin_in_fp16", "cache_wraps",
    "taylor_sincos", "additive_sinusoid", "norm_growing", "quadratic_angle", "constant_map",
    "decode_path_wrong", "strides_ignored", "mutates_input", "changes_dtype", "nan_at_zero",
    "wrong_backward", "grad_strided_output", "rope",
]

COORDS = "tests/nd_coordinate_kernels.py"
DINOV3 = ["--family", "axial", "--layout", "half", "--pair-span", "head", "--base", "100", "--positions", "float",
          "--coord-range=-1:1", "--coord-scale", "6.283185307179586"]
FAST_COORDS = ["--family", "axial", "--layout", "half", "--positions", "float", "--coord-range=-1:1",
               "--coord-scale", "10000", "--dtype", "float32"]
QWEN25VL_VISION = ["--family", "axial", "--layout", "half", "--split", "40,40", "--dtype", "float32"]  # + pair span
QWEN_IMAGE = ["--family", "axial", "--axes", "3", "--layout", "interleaved", "--split", "16,56,56",
              "--coord-range=-32:32", "--dtype", "float32"]
FLUX_IDS = ["--family", "axial", "--axes", "3", "--layout", "interleaved", "--split", "16,56,56", "--positions",
            "float", "--coord-range", "0:512", "--dtype", "float32"]
OFFSET_GRID = ["--family", "axial", "--layout", "interleaved", "--coord-range", "0:64", "--dtype", "float32"]
LTX_PAIRS = ["--family", "pairs", "--pair-table", "acceptance/kernels/ltx_pairs.json", "--positions", "float",
             "--coord-range", "0:1"]
# the real bugs at their models' configurations (issue 43): Wan at head 64, V-JEPA 2 ViT-L (a pair
# table: 3 x 20 of 64 features), FLUX.2's theta 2000, DINOv3 ViT-B in timm, Ideogram 4 under autocast
WAN = ["--family", "axial", "--axes", "3", "--layout", "interleaved", "--split", "24,20,20", "--max-position", "1023"]
VJEPA2_PAIRS = ["--family", "pairs", "--pair-table", "acceptance/kernels/vjepa2_pairs.json", "--coord-range", "0:63"]
VJEPA2_AXIAL = ["--family", "axial", "--axes", "3", "--split", "20,20,20", "--head-dim", "64", "--layout",
                "interleaved", "--coord-range", "0:63"]  # the last 4 of 64 features passed through
FLUX2 = ["--family", "axial", "--axes", "4", "--layout", "interleaved", "--split", "32,32,32,32", "--base", "2000",
         "--coord-range", "0:512"]
IDEOGRAM4 = ["--family", "mrope", "--sections", "88,20,20", "--mrope-interleaved", "--layout", "half", "--base",
             "5000000", "--coord-range", "65536:66559"]

CHECKS: dict[str, list] = {}
for name in BUILTINS:
    CHECKS[name] = [name]
for name in TRITON:
    CHECKS[name] = [name, *F32_BF16]
for name in ADAPTERS:
    CHECKS[name] = [name]
for name in MUTANTS:
    CHECKS[f"mutant-{name}"] = [f"tests/mutants.py:{name}", *HALF]
CHECKS.update({
    # call forms (tests/call_form_kernels.py)
    "sbhd-correct": ["tests/call_form_kernels.py:sbhd_correct", *HALF],
    "x-fast-path-bug": ["tests/call_form_kernels.py:x_fast_path_bug", *HALF, *F32],
    "qk-correct": ["tests/call_form_kernels.py:qk_correct", *QK],
    "qk-optional-k": ["tests/call_form_kernels.py:qk_optional_k", *QK, *F32],
    "qk-k-unrotated-mqa": ["tests/call_form_kernels.py:qk_k_unrotated_mqa", *QK, *F32],
    "qk-k-wrong-head": ["tests/call_form_kernels.py:qk_k_wrong_head", *QK, *F32],
    "qk-k-row0-positions": ["tests/call_form_kernels.py:qk_k_row0_positions", *QK, *F32],
    "qk-bad-k-backward": ["tests/call_form_kernels.py:qk_bad_k_backward", *QK, *F32],
    "packed-correct": ["tests/call_form_kernels.py:packed_correct", *PACKED],
    "packed-offsets-correct": ["tests/call_form_kernels.py:packed_offsets_correct", *PACKED, *F32],
    "packed-restart": ["tests/call_form_kernels.py:packed_restart", *PACKED, *F32],
    "packed-prev-offset": ["tests/call_form_kernels.py:packed_prev_offset", *PACKED, *F32],
    "packed-empty-skip": ["tests/call_form_kernels.py:packed_empty_skip", *PACKED, *F32],
    # modes (tests/mode_kernels.py)
    "mode-correct": ["tests/mode_kernels.py:correct", *HALF, *F32, "--mode", "eager", "--mode", "autocast"],
    "mode-matmul-angles": ["tests/mode_kernels.py:matmul_angles", *HALF, *F32, "--mode", "eager", "--mode",
                           "autocast"],
    "mode-compile-branch": ["tests/mode_kernels.py:compile_branch", *HALF, *F32, "--mode", "eager",
                            "--mode", "compile", "--property", "reference", "--property", "identity"],
    # sizes (tests/size_kernels.py)
    "size-correct": ["tests/size_kernels.py:correct", *HALF, *F32],
    "size-padded-exponent": ["tests/size_kernels.py:padded_exponent", *HALF, *F32],
    "size-batch-stride": ["tests/size_kernels.py:batch_stride", *HALF, *F32],
    "size-padded-exponent-production": ["tests/size_kernels.py:padded_exponent", *HALF, *F32, "--profile",
                                        "production", "--sizes", "production,head_dims=192,max_seq=256",
                                        "--property", "reference"],
    # precision (tests/precision_kernels.py): every check passes; only a baseline tells them apart
    "precision-angles64": ["tests/precision_kernels.py:angles64", *HALF, *F32_BF16],
    "precision-angles32": ["tests/precision_kernels.py:angles32", *HALF, *F32_BF16],
    # how targets fail (acceptance/kernels/verdicts.py)
    "crashes-past-1000": ["acceptance/kernels/verdicts.py:crashes_past_1000", *HALF, *F32],
    "hangs-on-long-calls": ["acceptance/kernels/verdicts.py:hangs_on_long_calls", *HALF, *F32, "--timeout", "3"],
    "fixed-table": ["acceptance/kernels/verdicts.py:fixed_table", *HALF, *F32],
    "fixed-table-declared": ["acceptance/kernels/verdicts.py:fixed_table", *HALF, *F32, "--max-position",
                             "2097151"],
    "clamped-table": ["acceptance/kernels/verdicts.py:clamped_table", *HALF, *F32],
    "view-as-complex": ["acceptance/kernels/verdicts.py:view_as_complex", "--layout", "interleaved", *F32],
    "view-as-complex-strict": ["acceptance/kernels/verdicts.py:view_as_complex", "--layout", "interleaved", *F32,
                               "--strict-layouts"],
    "returns-none": ["acceptance/kernels/verdicts.py:returns_none", *HALF, *F32],
    "sets-default-dtype": ["acceptance/kernels/verdicts.py:sets_default_dtype", *HALF, *F32],
    "in-process-correct": ["acceptance/kernels/verdicts.py:fixed_table", *HALF, *F32, "--in-process",
                           "--max-position", "2097151"],
    "spec-free-correct": ["tests/mutants.py:rope", *F32],
    "spec-free-sinusoid": ["tests/mutants.py:additive_sinusoid", *F32],
    "scaled-linear-undeclared": ["hf-llama-linear", "--layout", "half", "--base", "10000", *F32],
    # N-D, M-RoPE, xPos, builders (acceptance/kernels/nd.py, builders.py)
    "axial-interleaved": ["acceptance/kernels/nd.py:axial_interleaved", "--family", "axial", "--axes", "2",
                          "--layout", "interleaved"],
    "axial-summed-positions": ["acceptance/kernels/nd.py:axial_summed_positions", "--family", "axial", "--axes",
                               "2", "--layout", "interleaved", *F32],
    "nd-summed-positions": ["acceptance/kernels/nd.py:axial_summed_positions", "--family", "nd", "--axes", "2",
                            *F32],
    "mrope-toy": ["acceptance/kernels/nd.py:mrope_toy", "--family", "mrope", "--sections", "2,3,3"],
    "mrope-toy-axes-swapped": ["acceptance/kernels/nd.py:mrope_toy_axes_swapped", "--family", "mrope",
                               "--sections", "2,3,3", *F32],
    "mrope-toy-text-only": ["acceptance/kernels/nd.py:mrope_toy_text_only", "--family", "mrope", "--sections",
                            "2,3,3", *F32],
    "mrope-qwen2vl": ["acceptance/kernels/nd.py:qwen2vl_mrope", "--family", "mrope", "--sections", "16,24,24",
                      "--layout", "half", "--base", "1000000", "--dtype", "float32", "--dtype", "bfloat16",
                      "--dtype", "float16"],
    "mrope-qwen3vl": ["acceptance/kernels/nd.py:qwen3vl_mrope", "--family", "mrope", "--sections", "24,20,20",
                      "--mrope-interleaved", "--layout", "half", "--base", "5000000", "--dtype", "float32",
                      "--dtype", "bfloat16", "--dtype", "float16"],
    "axial-as-1d": ["llama-complex", "--family", "axial", "--axes", "1", "--layout", "interleaved"],
    # image and video RoPE on coordinates (tests/nd_coordinate_kernels.py): pair span, pair tables, diffusers
    **{f"coords-{name}": [f"{COORDS}:{kernel}", *flags] for name, kernel, flags in (
        ("dinov3", "dinov3", DINOV3),
        ("dinov3-bf16-angles", "dinov3_bf16_angles", DINOV3),
        ("fast-axial", "fast_axial", FAST_COORDS),
        ("fast-axial-bf16-angles", "fast_axial_bf16_angles", FAST_COORDS),
        ("qwen25vl-vision", "qwen25vl_vision", QWEN25VL_VISION + ["--pair-span", "head"]),
        ("qwen25vl-vision-per-block", "qwen25vl_vision", QWEN25VL_VISION),
        ("qwen-image", "qwen_image", QWEN_IMAGE),
        ("qwen-image-table-wraps", "qwen_image_table_wraps", QWEN_IMAGE),
        ("flux", "flux", FLUX_IDS),
        ("flux-ids-in-bf16", "flux_ids_in_bf16", FLUX_IDS),
        ("offset-grid", "offset_grid", OFFSET_GRID + ["--coord-offset", "8"]),
        ("offset-grid-undeclared", "offset_grid", OFFSET_GRID),
        ("ltx-pairs", "ltx", LTX_PAIRS),
        ("ltx-pairs-per-head", "ltx_per_head", LTX_PAIRS),
        ("diffusers-dinov3", "apply_rotary_emb", ["--api", "diffusers", *DINOV3]),
        ("diffusers-flux", "apply_rotary_emb", ["--api", "diffusers", *FLUX_IDS]),
        ("diffusers-unbind-ignored", "apply_rotary_emb_unbind_ignored", ["--api", "diffusers", *DINOV3]),
        ("diffusers-sequence-dim-ignored", "apply_rotary_emb_sequence_dim_ignored", ["--api", "diffusers", *DINOV3]),
        ("wan", "wan", WAN),
        ("wan-split-mismatch", "wan_split_mismatch", WAN),  # diffusers #12538
        ("vjepa2", "vjepa2", VJEPA2_PAIRS),
        ("vjepa2-repeat", "vjepa2_repeat", VJEPA2_PAIRS),  # vjepa2 PR #15
        ("vjepa2-axial", "vjepa2", VJEPA2_AXIAL),
        ("vjepa2-axial-repeat", "vjepa2_repeat", VJEPA2_AXIAL),
        ("flux2", "flux2", FLUX2),
        ("flux2-theta-dropped", "flux2_theta_dropped", FLUX2),  # diffusers #10111
        ("timm-dinov3", "timm_dinov3", [*DINOV3, "--split", "32,32"]),
        ("timm-dinov3-naflex-rot", "timm_dinov3_naflex_rot", [*DINOV3, "--split", "32,32"]),  # timm PR #2692
        ("ideogram4-autocast", "ideogram4", [*IDEOGRAM4, "--mode", "autocast"]),
        ("ideogram4-autocast-angles", "ideogram4_autocast_angles", [*IDEOGRAM4, "--mode", "autocast"]),  # #13920
        ("ideogram4-autocast-angles-eager", "ideogram4_autocast_angles", IDEOGRAM4),  # autocast's bug: eager passes
        # table builders of N-D rotations, judged by the rotation their tables make (--call builder)
        ("builder-flux", "flux_builder", [*FLUX_IDS, "--call", "builder"]),
        ("builder-flux-complex", "flux_builder_complex", [*FLUX_IDS, "--call", "builder"]),
        ("builder-flux-half-tables", "flux_builder_half_tables", [*FLUX_IDS, "--call", "builder"]),
        ("builder-flux-ids-in-bf16", "flux_builder_ids_in_bf16", [*FLUX_IDS, "--call", "builder"]),
        ("builder-flux2", "flux2_builder", ["--family", "table-builder", *FLUX2[2:]]),  # the alias
        ("builder-flux2-theta-dropped", "flux2_builder_theta_dropped", ["--family", "table-builder", *FLUX2[2:]]),
    )},
    "xpos-correct": ["acceptance/kernels/nd.py:xpos_correct", "--family", "xpos"],
    "xpos-key-upscaled": ["acceptance/kernels/nd.py:xpos_key_upscaled", "--family", "xpos", *F32],
    "xpos-scale-in-bf16": ["acceptance/kernels/nd.py:xpos_scale_in_bf16", "--family", "xpos", *F32],
    "builder-qwen2vl": ["acceptance/kernels/builders.py:qwen2vl_positions", "--family", "mrope-builder"],
    "builder-qwen2vl-early-text": ["acceptance/kernels/builders.py:qwen2vl_text_resumes_too_early", "--family",
                                   "mrope-builder"],
    "builtin-rope-tie-builder": ["ropecheck.reference.multimodal:rope_tie_positions", "--family",
                                 "rope-tie-builder"],
})

# Real model settings (issue 23): HF's own modules (acceptance runs them with their implied
# flags), the kernels of tests/real_config_kernels.py with the flags a user gives for each,
# spec-free where they are plain rotations, and the boundary slips that must fail.
ALL3 = ["--dtype", "float32", "--dtype", "bfloat16", "--dtype", "float16"]
REAL = "tests/real_config_kernels.py"
LLAMA3 = "llama3:factor={},low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=8192"
PHI35 = ["--layout", "half", "--base", "10000", "--rotary-dim", "96", "--scaling",
         "@acceptance/kernels/phi35_longrope.json"]
DEEPSEEK = ["--layout", "interleaved", "--base", "10000", "--rotary-dim", "64", "--scaling",
            "yarn:factor=40,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,mscale=1,mscale_all_dim=1"]
DYNAMIC = ["--layout", "half", "--base", "10000", "--rotary-dim", "128", "--scaling",
           "dynamic:factor=2,max_position_embeddings=4096"]
QWEN2VL = ["--family", "mrope", "--sections", "16,24,24", "--layout", "half", "--base", "1000000"]
GEMMA3_GLOBAL = ["--layout", "half", "--base", "1000000", "--rotary-dim", "256", "--scaling", "linear:factor=8"]
for name in ["hf-llama31", "hf-llama32", "hf-phi35-longrope", "hf-deepseek-v3-yarn", "hf-gpt-oss-yarn",
             "hf-gemma3-global", "hf-gemma3-local", "hf-qwen2vl-mrope-real", "hf-qwen3vl-mrope-real",
             "hf-glm4v-mrope"]:
    CHECKS[name] = [name, *ALL3]
CHECKS.update({
    "real-llama31": [f"{REAL}:llama31", "--layout", "half", "--base", "500000", "--rotary-dim", "128", "--scaling",
                     LLAMA3.format(8), *ALL3],
    "real-llama32": [f"{REAL}:llama32", "--layout", "half", "--base", "500000", "--rotary-dim", "64", "--scaling",
                     LLAMA3.format(32), *ALL3],
    "real-phi35-longrope": [f"{REAL}:phi35_longrope", *PHI35, *ALL3],
    "real-deepseek-v3-yarn": [f"{REAL}:deepseek_v3_yarn", *DEEPSEEK, *ALL3],
    "real-gpt-oss-yarn": [f"{REAL}:gpt_oss_yarn", "--layout", "half", "--base", "150000", "--rotary-dim", "64",
                          "--scaling", "yarn:factor=32,original_max_position_embeddings=4096,beta_fast=32,"
                          "beta_slow=1,truncate=false", *ALL3],
    "real-dynamic-ntk": [f"{REAL}:dynamic_ntk", *DYNAMIC, *ALL3],
    "real-gemma3-global": [f"{REAL}:gemma3_global", *GEMMA3_GLOBAL, *ALL3],
    "real-gemma3-global-spec-free": [f"{REAL}:gemma3_global", "--rotary-dim", "256", *ALL3],
    "real-gemma3-local": [f"{REAL}:gemma3_local", "--layout", "half", "--base", "10000", "--rotary-dim", "256",
                          *ALL3],
    "real-qwen2vl-mrope-vllm": [f"{REAL}:qwen2vl_mrope_vllm", *QWEN2VL, *ALL3],
    "real-qwen2vl-mrope-megatron": [f"{REAL}:qwen2vl_mrope_megatron", *QWEN2VL, *ALL3],
    "real-qwen2vl-mrope-spec-free": [f"{REAL}:qwen2vl_mrope_vllm", "--family", "nd", "--axes", "3", "--split",
                                     "32,48,48", *ALL3],
    "real-qwen3vl-mrope": [f"{REAL}:qwen3vl_mrope", "--family", "mrope", "--sections", "24,20,20",
                           "--mrope-interleaved", "--layout", "half", "--base", "5000000", *ALL3],
    "real-glm4v-mrope": [f"{REAL}:glm4v_mrope", "--family", "mrope", "--sections", "8,12,12", "--layout",
                         "interleaved", "--base", "10000", "--rotary-dim", "64", *ALL3],
    "real-xpos-128": [f"{REAL}:xpos_128", "--family", "xpos", *ALL3],
    # slips at the same settings: each must fail
    "real-phi35-longrope-ge": [f"{REAL}:phi35_longrope_ge", *PHI35, *F32_BF16],
    "real-phi35-longrope-max-position": [f"{REAL}:phi35_longrope_max_position", *PHI35, *F32_BF16],
    "real-dynamic-ntk-max-position": [f"{REAL}:dynamic_ntk_max_position", *DYNAMIC, *F32_BF16],
    "real-deepseek-v3-yarn-ramp-early": [f"{REAL}:deepseek_v3_yarn_ramp_early", *DEEPSEEK, *F32_BF16],
    "real-qwen2vl-mrope-w-ignored": [f"{REAL}:qwen2vl_mrope_w_ignored", *QWEN2VL, *F32_BF16],
    "real-gemma3-global-frozen": [f"{REAL}:gemma3_global_frozen", *GEMMA3_GLOBAL, *F32_BF16],
})
# library interfaces (--api presets): kernels written to each library's signature, correct
# ones and the defects each must catch (tests/preset_kernels.py)
PRESET_KERNELS = {
    "vllm": ["vllm_correct", "vllm_next_row", "vllm_cos_sin_swapped", "vllm_key_none_crashes",
             "vllm_key_none_rotates_query", "vllm_one_head_stride", "vllm_token_stride_ignored",
             "vllm_mqa_key_unrotated", "vllm_wrong_head", "vllm_fused_path_bug", "vllm_stale_cache",
             "vllm_writes_cache"],
    "flashinfer-cos-sin-cache": ["flashinfer_cache_correct", "flashinfer_cache_next_row"],
    "flashinfer-pos-ids": ["pos_ids_correct", "pos_ids_int16"],
    "flash-attn": ["flash_correct", "flash_row0_offsets", "flash_decode_row0", "flash_cos_sin_swapped",
                   "flash_half_read_as_full"],
    "hf": ["hf_correct", "hf_batch_row0", "hf_mqa_key_unrotated"],
    "te": ["te_correct", "te_row0_start_positions"],
    "megatron": ["megatron_correct", "megatron_interleaved_ignored", "megatron_writes_freqs"],
}
for _api, _names in PRESET_KERNELS.items():
    for _name in _names:
        CHECKS[f"api-{_name.replace('_', '-')}"] = [f"tests/preset_kernels.py:{_name}", "--api", _api, *HALF,
                                                   *F32_BF16]
CHECKS.update({
    "api-vllm-correct-partial": ["tests/preset_kernels.py:vllm_correct", "--api", "vllm", *HALF, "--rotary-dim",
                                 "32", *F32_BF16],
    "api-vllm-rotary-dim-ignored": ["tests/preset_kernels.py:vllm_rotary_dim_ignored", "--api", "vllm", *HALF,
                                    "--rotary-dim", "32", *F32_BF16],
    "api-pos-ids-rotary-dim-ignored": ["tests/preset_kernels.py:pos_ids_rotary_dim_ignored", "--api",
                                       "flashinfer-pos-ids", *HALF, "--rotary-dim", "32", *F32_BF16],
    "api-flash-correct-packed": ["tests/preset_kernels.py:flash_correct", "--api", "flash-attn", "--call", "packed",
                                 "--layout", "interleaved", *F32_BF16],
    "api-te-correct-packed": ["tests/preset_kernels.py:te_correct", "--api", "te", "--call", "packed", *HALF,
                              *F32_BF16],
    "api-megatron-correct-packed-yarn": ["tests/preset_kernels.py:megatron_correct", "--api", "megatron", "--call",
                                         "packed", *HALF, "--scaling", "yarn:factor=4", *F32_BF16],
    "api-megatron-thd-restarts": ["tests/preset_kernels.py:megatron_thd_restarts", "--api", "megatron", "--call",
                                  "packed", *HALF, *F32_BF16],
    "api-megatron-mscale-ignored": ["tests/preset_kernels.py:megatron_mscale_ignored", "--api", "megatron", *HALF,
                                    "--scaling", "yarn:factor=4", *F32_BF16],
})

# fused serving kernels (issue 26): rope + KV-cache write through vLLM's and SGLang's
# signatures, every defect in both; MLA's k_pe with its latent row stride ignored
# (tests/serving_kernels.py)
for _prefix, _api in (("vllm_kv", "vllm-kvcache"), ("sglang_kv", "sglang-kvcache")):
    for _kind in ("correct", "key_only_in_cache", "slot_off_by_one", "padding_written", "value_rotated"):
        _name = f"{_prefix}_{_kind}"
        CHECKS[f"api-{_name.replace('_', '-')}"] = [f"tests/serving_kernels.py:{_name}", "--api", _api, *HALF,
                                                   *F32_BF16]
CHECKS["api-vllm-kv-correct-interleaved-partial"] = ["tests/serving_kernels.py:vllm_kv_correct", "--api",
                                                     "vllm-kvcache", "--layout", "interleaved", "--base", "10000",
                                                     "--rotary-dim", "32", *F32_BF16]
CHECKS["api-vllm-key-row-stride-ignored"] = ["tests/serving_kernels.py:vllm_key_row_stride_ignored", "--api", "vllm",
                                             *HALF, *F32_BF16]

CHECKS["api-sglang-kv-cached-unrotated"] = ["tests/serving_kernels.py:sglang_kv_cached_unrotated", "--api",
                                            "sglang-kvcache", *HALF, *F32_BF16]
CHECKS["api-te-buffer-as-batch"] = ["tests/preset_kernels.py:te_buffer_as_batch", "--api", "te", *HALF, *F32_BF16]

# every path of an interface (issue 41): kernels written as production code is, each correct
# one beside the bug that lives in one path (a class of argument values, a library's
# convention, a size switch) (tests/path_kernels.py)
_PATHS = "tests/path_kernels.py"
for _name, _flags in {
    "flash_varlen_correct": ["--api", "flash-attn"],
    "flash_varlen_first_offset": ["--api", "flash-attn"],
    "flash_inplace_ignored": ["--api", "flash-attn"],
    "hf_rows_correct": ["--api", "hf"],
    "hf_decode_batch0": ["--api", "hf"],
    "hf_cos_per_row": ["--api", "hf"],
    "vllm_rows_correct": ["--api", "vllm", "--rotary-dim", "32"],
    "vllm_warp_chunk_partial": ["--api", "vllm", "--rotary-dim", "32"],
    "sglang_kv_slot0_correct": ["--api", "sglang-kvcache"],
    "te_rows_correct": ["--api", "te"],
    "te_thd_first_start": ["--api", "te"],
}.items():
    CHECKS[f"path-{_name.replace('_', '-')}"] = [f"{_PATHS}:{_name}", *_flags, *HALF, *F32_BF16]

# context parallelism (issue 26): the load-balanced split over --cp-size ranks
# (tests/cp_kernels.py)
_CP = "tests/cp_kernels.py"
CHECKS.update({
    "cp-te-correct-sbhd-bshd": [f"{_CP}:te_cp_correct", "--api", "te", *HALF, "--cp-size", "2", *F32_BF16],
    "cp-te-correct-thd": [f"{_CP}:te_cp_correct", "--api", "te", "--call", "packed", *HALF, "--cp-size", "3",
                          *F32_BF16],
    "cp-te-second-chunk-as-first": [f"{_CP}:te_cp_second_chunk_as_first", "--api", "te", *HALF, "--cp-size", "2",
                                    *F32_BF16],
    "cp-te-thd-sequence0-offsets": [f"{_CP}:te_cp_thd_sequence0_offsets", "--api", "te", "--call", "packed",
                                    *HALF, "--cp-size", "2", *F32_BF16],
    "cp-te-ignored": [f"{_CP}:te_cp_ignored", "--api", "te", *HALF, "--cp-size", "2", *F32_BF16],
    "cp-te-writes-input": [f"{_CP}:te_cp_writes_input", "--api", "te", *HALF, "--cp-size", "2", *F32_BF16],
    "cp-megatron-correct-thd": [f"{_CP}:megatron_cp_correct", "--api", "megatron", "--call", "packed", *HALF,
                                "--cp-size", "2", *F32_BF16],
    "cp-megatron-sequence0-rows": [f"{_CP}:megatron_cp_sequence0_rows", "--api", "megatron", "--call", "packed",
                                   *HALF, "--cp-size", "2", *F32_BF16],
    "cp-megatron-core-packed": ["megatron-core-apply-rotary-pos-emb-packed", "--cp-size", "2", *F32_BF16],
})

# fp8 outputs (issue 26): kernels in FlashInfer's rope_quantize_fp8 signature (tests/fp8_kernels.py)
FP8 = ["--api", "flashinfer-rope-fp8", *HALF, *F32_BF16]
for _name in ["fp8_correct", "fp8_rounds_to_input_dtype", "fp8_scale_twice", "fp8_q_scale_for_k", "fp8_nope_rotated",
              "fp8_nope_unscaled", "fp8_no_saturation", "fp8_returns_input_dtype", "fp8_e4m3_always",
              "fp8_rotates_in_place"]:
    CHECKS[f"api-{_name.replace('_', '-')}"] = [f"tests/fp8_kernels.py:{_name}", *FP8, "--rotary-dim", "32"]
CHECKS.update({
    "api-fp8-correct-full": ["tests/fp8_kernels.py:fp8_correct", *FP8],
    "api-fp8-correct-interleaved-yarn": ["tests/fp8_kernels.py:fp8_correct", *FP8, "--layout", "interleaved",
                                         "--rotary-dim", "64", "--scaling", "yarn:factor=4"],
})

# table builders (issue 25): the builder half of a pipeline, tests/table_builder_kernels.py and
# every installed library's builder (their flags implied)
TABLE = ["--family", "table-builder", "--rotary-dim", "64", "--layout", "half"]
CACHE = ["--family", "cache-builder", "--rotary-dim", "64"]
TB = "tests/table_builder_kernels.py"
CHECKS.update({
    "table-builder-correct": [f"{TB}:correct_table", *TABLE],
    "table-builder-yarn-no-mscale": [f"{TB}:yarn_no_mscale", *TABLE, "--scaling",
                                     "yarn:factor=4,original_max_position_embeddings=1024"],
    "table-builder-dynamic-leak": [f"{TB}:dynamic_leak", *TABLE, "--scaling",
                                   "dynamic:factor=2,max_position_embeddings=4096"],
    "cache-builder-correct": [f"{TB}:correct_cache", *CACHE],
    "cache-builder-row-shift": [f"{TB}:cache_row_shift", *CACHE],
})
for name in ["hf-rotary", "hf-rotary-linear", "hf-rotary-dynamic", "hf-rotary-yarn", "hf-rotary-llama3",
             "hf-rotary-longrope", "hf-rotary-partial", "hf-rope-init-yarn", "hf-rope-init-longrope",
             "flash-attn-rotary-cache", "flash-attn-rotary-cache-bf16", "torchtune-rope-cache",
             "torchtune-llama3-scaled-cache", "megatron-core-cos-sin", "megatron-core-cos-sin-llama3"]:
    CHECKS[name] = [name]

# `ropecheck identify` verdicts: the flags it prints
IDENTIFY = ["rotate-half", "llama-complex", "hf-llama-llama3", "hf-llama-yarn", "hf-gpt-neox",
            "tests/mutants.py:sign_flipped", "tests/mutants.py:additive_sinusoid", "tests/mutants.py:norm_growing"]
# N-D (`identify --family nd --axes N`): an entry is the target and its identify flags, in one string
ND_ID = "acceptance/kernels/nd.py"
IDENTIFY += [f"{ND_ID}:{kernel} --family nd --axes {axes}" for kernel, axes in [
    ("axial_interleaved", 2), ("mrope_toy", 3), ("qwen2vl_mrope", 3), ("qwen3vl_mrope", 3),
    ("mrope_toy_axes_swapped", 3),  # a rotation no family declares: a pair table
    ("axial_summed_positions", 2),  # the seed's R_{x+y}: pairs turn with both axes, refused
]]

# fused QK-RMSNorm + RoPE (issue 45): kernels in vLLM's and SGLang's fused_qk_norm_rope
# signatures, the correct ones beside the real defects (tests/qk_norm_kernels.py)
_QKN = "tests/qk_norm_kernels.py"
for _name, _flags in {
    "vllm_correct": ["--api", "vllm-qk-norm-rope"],
    "vllm_writes_v": ["--api", "vllm-qk-norm-rope"],
    "vllm_k_uses_q_weight": ["--api", "vllm-qk-norm-rope"],
    "vllm_no_eps": ["--api", "vllm-qk-norm-rope"],
    "vllm_norm_after_rotation": ["--api", "vllm-qk-norm-rope"],
    "vllm_rotary_dim_ignored": ["--api", "vllm-qk-norm-rope", "--rotary-dim", "32"],
    "vllm_partial_neox_chunks": ["--api", "vllm-qk-norm-rope", "--rotary-dim", "32"],
    "sglang_correct": ["--api", "sglang-qk-norm-rope"],
    "sglang_attention_factor_ignored": ["--api", "sglang-qk-norm-rope", "--scaling",
                                        "yarn:factor=4,original_max_position_embeddings=4096"],
}.items():
    CHECKS[f"qk-norm-{_name.replace('_', '-')}"] = [f"{_QKN}:{_name}", *_flags, *HALF, *F32_BF16]
CHECKS["qk-norm-vllm-correct-partial-interleaved"] = [f"{_QKN}:vllm_correct", "--api", "vllm-qk-norm-rope",
                                                      "--layout", "interleaved", "--rotary-dim", "32", *F32_BF16]

# M-RoPE through the serving presets (issue 45): positions (3, T), text, image and video
# tokens, chunked and interleaved sections (tests/mrope_serving_kernels.py)
_MRS = "tests/mrope_serving_kernels.py"
_QWEN2VL_S = ["--family", "mrope", "--sections", "16,24,24", "--base", "1000000"]
_QWEN3VL_S = ["--family", "mrope", "--sections", "24,20,20", "--mrope-interleaved", "--base", "5000000"]
for _name, _flags in {
    "vllm_correct": ["--api", "vllm", *_QWEN2VL_S],
    "vllm_correct-interleaved": ["--api", "vllm", *_QWEN3VL_S],
    "flashinfer_correct": ["--api", "flashinfer-cos-sin-cache", *_QWEN2VL_S],
    "vllm_kv_correct": ["--api", "vllm-kvcache", *_QWEN2VL_S],
    "sglang_kv_correct": ["--api", "sglang-kvcache", *_QWEN3VL_S],
    "qk_norm_correct": ["--api", "vllm-qk-norm-rope", *_QWEN3VL_S],
    "sglang_correct": ["--api", "sglang-mrope", *_QWEN2VL_S],
    "vllm_temporal_row_only": ["--api", "vllm", *_QWEN2VL_S],
    "sglang_temporal_row_only": ["--api", "sglang-mrope", *_QWEN3VL_S],
    "sglang_kv_temporal_row_only": ["--api", "sglang-kvcache", *_QWEN2VL_S],
    "qk_norm_temporal_row_only": ["--api", "vllm-qk-norm-rope", *_QWEN3VL_S],
    "vllm_token_count_from_numel": ["--api", "vllm", *_QWEN2VL_S],
    "vllm_interleaved_selector": ["--api", "vllm", *_QWEN3VL_S, "--dtype", "float32"],
}.items():
    _kernel = _name.split("-")[0]
    CHECKS[f"mrope-serving-{_name.replace('_', '-')}"] = [f"{_MRS}:{_kernel}", *_flags]

# a model's own config (issue 45): --hf-config on configs of real models, transformers' modules and
# each serving stack's slip of a config (tests/hf_config_kernels.py, tests/p_rope_kernels.py)
_HFC = "tests/data/hf_configs"
_HFK = "tests/hf_config_kernels.py"
for _name, (_kernel, _config, _layer) in {
    "phi2": (f"{_HFK}:phi2", "phi-2.json", None),
    "phi2-partial-twice": (f"{_HFK}:phi2_partial_twice", "phi-2.json", None),
    "phi2-partial-over-head": (f"{_HFK}:phi2_partial_over_head", "phi-2.json", None),
    "laguna-yarn": (f"{_HFK}:laguna_yarn", "laguna-yarn-attention-factor.json", None),
    "laguna-yarn-default-mscale": (f"{_HFK}:laguna_yarn_default_mscale", "laguna-yarn-attention-factor.json", None),
    "gemma3-local": ("tests/real_config_kernels.py:gemma3_local", "gemma-3-4b-it.json", "sliding_attention"),
    "gemma3-local-with-global-base": (f"{_HFK}:gemma3_local_with_global_base", "gemma-3-4b-it.json",
                                      "sliding_attention"),
    "gemma3-global": ("tests/real_config_kernels.py:gemma3_global", "gemma-3-4b-it.json", "full_attention"),
    "gemma3-global-unscaled": (f"{_HFK}:gemma3_global_unscaled", "gemma-3-4b-it.json", "full_attention"),
    "qwen3-8b": (f"{_HFK}:qwen3_8b", "qwen3-8b.json", None),
    "llama31": ("tests/real_config_kernels.py:llama31", "llama-3.1-8b.json", None),
    "deepseek-v3": ("tests/real_config_kernels.py:deepseek_v3_yarn", "deepseek-v3.json", None),
    "gpt-oss": ("tests/real_config_kernels.py:gpt_oss_yarn", "gpt-oss-20b.json", None),
    "phi3-mini-128k": (f"{_HFK}:phi3_mini_128k", "phi-3-mini-128k-instruct.json", None),
    "qwen2vl": ("tests/real_config_kernels.py:qwen2vl_mrope_vllm", "qwen2-vl-7b-instruct.json", None),
    "p-rope": ("tests/p_rope_kernels.py:p_rope", "gemma4-proportional.json", "full_attention"),
    "p-rope-as-partial-rotary": ("tests/p_rope_kernels.py:p_rope_as_partial_rotary", "gemma4-proportional.json",
                                 "full_attention"),
}.items():
    CHECKS[f"hf-config-{_name}"] = [_kernel, "--hf-config", f"{_HFC}/{_config}",
                                    *(["--layer-type", _layer] if _layer else []), *F32_BF16]

# the op around the kernel (issue 45): torch.library custom ops under --opcheck, a correct RoPE
# underneath each, the registration wrong or right (tests/custom_op_kernels.py)
_OPS = "tests/custom_op_kernels.py"
for _name, _flags in {
    "rope_op": [],
    "rope_strided_fake": [],
    "strided_wrapper": [],
    "rope_aliasing": ["--inplace", "--no-backward"],
    "plain_rope": [],
}.items():
    CHECKS[f"opcheck-{_name.replace('_', '-')}"] = [f"{_OPS}:{_name}", *HALF, "--opcheck", *_flags, *F32]
CHECKS["opcheck-vllm-op"] = [f"{_OPS}:vllm_op", "--api", "vllm", *HALF, "--opcheck", *F32]
CHECKS["opcheck-vllm-unannotated"] = [f"{_OPS}:vllm_unannotated", "--api", "vllm", *HALF, "--opcheck", *F32]
