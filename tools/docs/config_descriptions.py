"""What each config key does, for keys whose model field carries no `description` yet.

Read by gen_config_reference.py. A key is its full dotted path; `<name>` stands for a
user-chosen group name; a key containing `*` is a pattern (fnmatch) that describes every
matching key no exact entry covers. An entry that matches no key fails the docs test, and so
does a key with no description at all: when a model gains a field, describe it here (or, better,
give the field a `description=` and drop the entry here).

Say what the key does for the user, in this implementation; what it does *here* (implemented,
warned, refused) is the key-effect column, from the models' own tables.
"""

DESCRIPTIONS = {
    # ---------------------------------------------------------------- core: batch and steps
    "train_batch_size":
        "Samples per optimizer step over all data-parallel ranks: micro-batch x gradient "
        "accumulation steps x data-parallel size. Give any two of the three batch keys and the "
        "third is derived; all three must agree.",
    "train_micro_batch_size_per_gpu": "Samples each rank processes in one forward/backward.",
    "gradient_accumulation_steps":
        "Micro-batches whose gradients are summed before each optimizer step.",
    "gradient_clipping":
        "Clip the global gradient norm to this value before each step; 0 disables clipping.",
    "steps_per_print":
        "Log the learning rate and throughput every this many optimizer steps; null turns the "
        "report off.",
    "wall_clock_breakdown":
        "Time forward, backward, gradient reduction and step, and add the times to the periodic "
        "log line.",
    "dump_state": "Print the engine's resolved configuration at initialization.",
    "memory_breakdown":
        "Log the accelerator's allocated and cached memory with the periodic report.",
    "prescale_gradients":
        "Divide gradients by the data-parallel size before the all-reduce instead of after it.",
    "gradient_predivide_factor":
        "Divide gradients by this factor before the all-reduce and by world size / factor after "
        "it (fp16 overflow control).",
    "sparse_gradients":
        "All-reduce the gradients of `nn.Embedding(sparse=True)` layers as indices and values "
        "instead of dense tensors.",
    "communication_data_type":
        "Data type of the gradient all-reduce: \"fp16\", \"bf16\" (\"bfp16\" also accepted) or "
        "\"fp32\"; null uses the training data type.",
    "zero_allow_untested_optimizer":
        "Allow ZeRO with an optimizer the engine did not build from the config (a client "
        "optimizer).",
    "zero_force_ds_cpu_optimizer":
        "With ZeRO-Offload, insist on DeepSpeed's CPU optimizers (DeepSpeedCPUAdam and friends); "
        "false lets any optimizer run on the host.",
    "dataloader_drop_last":
        "Drop the last incomplete batch of the data loader that "
        "`deepspeed.initialize(training_data=...)` builds.",

    # ---------------------------------------------------------------- core: precision
    "fp16.enabled": "Train in fp16 with fp32 master weights and loss scaling.",
    "fp16.auto_cast": "Cast the model's floating inputs to fp16 in forward.",
    "fp16.loss_scale_window": "Overflow-free steps after which the dynamic loss scale doubles.",
    "fp16.hysteresis": "Overflows tolerated before the dynamic loss scale is lowered.",
    "fp16.consecutive_hysteresis":
        "Refill the hysteresis after every overflow-free step rather than only when the scale "
        "grows.",
    "fp16.min_loss_scale": "Lower bound of the dynamic loss scale.",
    "bf16.enabled": "Train in bfloat16 with fp32 master weights (no loss scaling needed).",
    "amp.enabled": "Use NVIDIA apex AMP for mixed precision (needs apex and a GPU).",
    "amp.*": "Passed to `apex.amp.initialize` unchanged; see apex's documentation.",
    "data_types": "Data types of buffers that need not follow the training data type.",
    "data_types.grad_accum_dtype":
        "Data type in which gradients are accumulated across micro-batches; null uses the "
        "training data type.",

    # ---------------------------------------------------------------- core: optimizer, schedule
    "optimizer.type":
        "Optimizer name, any case: Adam, AdamW, Lamb, Lion, Adagrad, OneBitAdam, ZeroOneAdam, "
        "OneBitLamb, MuAdam / MuAdamW / MuSGD (the mup package), or any torch.optim class "
        "name (SGD, RMSprop, ...).",
    "optimizer.params":
        "Keyword arguments of the optimizer's constructor (lr, betas, eps, weight_decay, ...).",
    "scheduler.type":
        "Learning-rate schedule: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest.",
    "scheduler.params":
        "Keyword arguments of the schedule (warmup_num_steps, total_num_steps, ...).",

    # ---------------------------------------------------------------- core: checkpoints
    "checkpoint.tag_validation":
        "Whether ranks check that they save under the same tag: \"Ignore\", \"Warn\" or \"Fail\" "
        "(any case).",
    "checkpoint.load_universal":
        "Load a universal checkpoint (made by `ds_to_universal`), which resumes on another number "
        "of ranks or ZeRO stage.",
    "checkpoint.use_node_local_storage":
        "Every node writes its own copy of the shared files, for storage that is not shared "
        "between nodes.",
    "checkpoint.checkpoint_engine.type":
        "How checkpoint files are written: \"torch\", \"safetensors\", or \"async\" (written in "
        "the background while training continues).",
    "checkpoint.checkpoint_engine.format":
        "File format the \"async\" engine writes: \"torch\" or \"safetensors\"; null follows the "
        "engine type.",
    "nebula.enabled":
        "Use Nebula asynchronous checkpointing; served by the built-in \"async\" engine here.",

    # ------------------------------------------------------- core: activation checkpointing
    "activation_checkpointing.partition_activations":
        "Split each checkpointed activation across model-parallel ranks.",
    "activation_checkpointing.contiguous_memory_optimization":
        "Copy checkpointed activations into one contiguous buffer to limit fragmentation.",
    "activation_checkpointing.cpu_checkpointing":
        "Keep checkpointed activations in host memory between forward and backward.",
    "activation_checkpointing.number_checkpoints":
        "Number of checkpoints the contiguous buffer is sized for.",
    "activation_checkpointing.synchronize_checkpoint_boundary":
        "Synchronize the device at every checkpoint boundary.",
    "activation_checkpointing.profile":
        "Log the time spent in checkpointed forward and recomputation.",

    # ---------------------------------------------------------------- asynchronous I/O (NVMe)
    "aio": "Asynchronous I/O settings of the NVMe offload swapper (libaio).",
    "*aio.single_submit": "Submit I/O requests one at a time instead of in batches.",
    "*aio.overlap_events": "Submit new requests while earlier ones complete.",
    "*aio.use_gds": "Use NVIDIA GPUDirect Storage (cuFile) handles.",

    # ---------------------------------------------------------------- ZeRO
    "zero_optimization":
        "ZeRO: partition optimizer state (stage 1), gradients (stage 2) and parameters (stage 3) "
        "over the data-parallel ranks, with optional CPU or NVMe offload.",
    "zero_optimization.stage":
        "0 disables ZeRO; 1 partitions optimizer state; 2 also gradients; 3 also parameters.",
    "zero_optimization.contiguous_gradients":
        "Copy each gradient into its bucket's flat buffer as backward produces it and free it; "
        "false keeps it in param.grad until its bucket is reduced.",
    "zero_optimization.reduce_scatter":
        "Reduce gradients with reduce-scatter (each rank receives its partition) instead of "
        "all-reduce.",
    "zero_optimization.use_multi_rank_bucket_allreduce":
        "Without reduce_scatter: reduce a bucket with one all-reduce (true) or with one reduce "
        "to each rank's piece (false).",
    "zero_optimization.allgather_partitions":
        "Collect updated parameters with an all-gather after each step (rather than broadcasts).",
    "zero_optimization.load_from_fp32_weights":
        "On load, restore the fp32 master weights from the checkpoint's optimizer state rather "
        "than from the 16-bit model weights.",
    "zero_optimization.elastic_checkpoint":
        "Allow a ZeRO stage 1/2 checkpoint to be loaded on a different number of ranks.",
    "zero_optimization.offload_param.device":
        "Where partitioned parameters live: \"none\", \"cpu\" or \"nvme\" (stage 3 only).",
    "zero_optimization.offload_optimizer.device":
        "Where optimizer state and the optimizer step live: \"none\", \"cpu\" or \"nvme\".",
    "zero_optimization.offload_*.nvme_path":
        "Directory on the NVMe device for swapped tensors (needed with device \"nvme\").",
    "zero_optimization.offload_*.pin_memory":
        "Use page-locked host memory for offloaded tensors (faster device copies).",
    "zero_optimization.stage3_prefetch_bucket_size":
        "Parameter elements gathered ahead of use (stage 3).",
    "zero_optimization.stage3_param_persistence_threshold":
        "Parameters smaller than this many elements stay whole on every rank (stage 3).",
    "zero_optimization.stage3_model_persistence_threshold":
        "Upper bound on the total elements of persistent (unpartitioned) parameters (stage 3).",
    "zero_optimization.stage3_max_live_parameters":
        "Upper bound on gathered parameter elements held at once (stage 3).",
    "zero_optimization.stage3_max_reuse_distance":
        "Keep a gathered parameter if it is needed again within this many elements of other "
        "parameters (stage 3).",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save":
        "Gather the full 16-bit weights when saving the model (`save_16bit_model`, HF "
        "`save_model`).",
    "zero_optimization.ignore_unused_parameters":
        "Tolerate parameters that receive no gradient; false makes them an error.",
    "zero_optimization.legacy_stage1": "Use upstream's original stage 1 implementation.",
    "zero_optimization.zero_quantized_weights":
        "ZeRO++ qwZ: all-gather parameters as int8 with per-block scales (stage 3).",
    "zero_optimization.zero_quantized_nontrainable_weights":
        "MixZ++: store frozen weights' shards as int8 (stage 3).",
    "zero_optimization.zero_quantized_gradients":
        "ZeRO++ qgZ: reduce gradients as int4 through a hierarchical all-to-all (stage 3).",
    "zero_optimization.mics_shard_size":
        "MiCS: shard model states over groups of this many ranks and replicate across groups; -1 "
        "disables.",
    "zero_optimization.mics_hierarchical_params_gather":
        "MiCS: gather parameters in two hops (across nodes, then within a node).",
    "zero_optimization.memory_efficient_linear":
        "ZeRO-3: autograd keeps no gathered weight whole between a module's forward and its "
        "backward (saved views are rebuilt from the parameter); false keeps them.",
    "zero_optimization.pipeline_loading_checkpoint": "Load checkpoints in pipeline mode (ZeRO-3).",
    "zero_optimization.override_module_apply":
        "ZeRO-3: Module.apply called while zero.Init builds a model gathers the parameters "
        "first, so custom initialisation reaches them.",

    # ---------------------------------------------------------------- autotuning
    "autotuning.enabled": "Turn on autotuning for `deepspeed --autotuning tune|run`.",
    "autotuning.results_dir":
        "Directory for each experiment's config, log and result, and the summary and best config.",
    "autotuning.exps_dir": "Directory for the experiment descriptions.",
    "autotuning.overwrite": "Rerun experiments whose results already exist.",
    "autotuning.metric": "What to optimize: \"throughput\", \"latency\" or \"FLOPS\".",
    "autotuning.start_profile_step": "First training step that an experiment measures.",
    "autotuning.end_profile_step": "Step after which an experiment stops measuring and exits.",
    "autotuning.fast":
        "Tune only the ZeRO stage and micro-batch size; false also tunes each stage's ZeRO knobs.",
    "autotuning.max_train_batch_size": "Largest global batch size an experiment may use.",
    "autotuning.min_train_batch_size": "Smallest global batch size an experiment may use.",
    "autotuning.max_train_micro_batch_size_per_gpu": "Largest micro-batch size tried.",
    "autotuning.min_train_micro_batch_size_per_gpu": "Smallest micro-batch size tried.",
    "autotuning.num_tuning_micro_batch_sizes": "How many micro-batch sizes are tried per stage.",
    "autotuning.mp_size": "Model-parallel size of the job, used in the memory estimate.",
    "autotuning.tuner_type": "Search strategy: \"model_based\", \"gridsearch\" or \"random\".",
    "autotuning.tuner_early_stopping": "Stop after this many experiments without improvement.",
    "autotuning.tuner_num_trials": "Largest number of experiments per search space.",
    "autotuning.arg_mappings":
        "Map config keys to the training script's command-line flags, for scripts that take batch "
        "sizes as arguments.",
    "autotuning.metric_path":
        "File where an experiment writes its metric (default: in its results directory).",
    "autotuning.model_info_path": "File with the model information, instead of a profiling run.",
    "autotuning.model_info.profile":
        "Only profile the model (parameters, activation memory) and exit.",
    "autotuning.model_info.num_params": "Number of model parameters, if known.",
    "autotuning.model_info.hidden_size": "Model hidden size, if known.",
    "autotuning.model_info.num_layers": "Number of model layers, if known.",

    # ---------------------------------------------------------------- monitors
    "tensorboard": "Write training scalars (loss, learning rate, ...) as TensorBoard events.",
    "wandb": "Log training scalars to Weights & Biases.",
    "csv_monitor": "Write training scalars to CSV files.",
    "comet": "Log training scalars to a Comet experiment.",
    "*.enabled": "Turn this section's feature on.",
    "tensorboard.output_path": "Directory for the event files (default: the working directory).",
    "csv_monitor.output_path": "Directory for the CSV files (default: the working directory).",
    "tensorboard.job_name": "Sub-directory name of this run under `output_path`.",
    "csv_monitor.job_name": "Sub-directory name of this run under `output_path`.",
    "wandb.group": "W&B group of the run.",
    "wandb.team": "W&B team (entity) of the run.",
    "wandb.project": "W&B project of the run.",
    "comet.samples_log_interval": "Log a scalar series every this many samples.",
    "comet.project": "Comet project name.",
    "comet.workspace": "Comet workspace.",
    "comet.api_key": "Comet API key (else the comet_ml configuration or environment).",
    "comet.experiment_name": "Name of a new experiment.",
    "comet.experiment_key": "Key of an existing experiment to continue.",
    "comet.online": "false keeps the experiment on disk (offline mode).",
    "comet.mode": "comet_ml's start mode: \"get\", \"create\" or \"get_or_create\".",

    # ---------------------------------------------------------------- comms logger, profilers
    "comms_logger":
        "Record every `deepspeed.comm` collective (op, message size, latency, bandwidth) for "
        "`deepspeed.comm.log_summary()`.",
    "comms_logger.verbose": "Also log each operation as it happens.",
    "comms_logger.prof_all": "Record every operation; false records only those in `prof_ops`.",
    "comms_logger.prof_ops": "Operation names to record when `prof_all` is false.",
    "comms_logger.debug": "Add the calling function's name to each record.",
    "flops_profiler": "Profile one training step: latency, flops, MACs and parameters per module.",
    "flops_profiler.recompute_fwd_factor":
        "Fraction of the forward recomputed in backward (activation checkpointing), for the flops "
        "count.",
    "flops_profiler.profile_step": "Training step that is profiled.",
    "flops_profiler.module_depth": "Depth of the module tree in the report; -1 is all.",
    "flops_profiler.top_modules": "Modules listed per depth in the aggregated report.",
    "flops_profiler.detailed": "Print the per-module tree in addition to the summary.",
    "flops_profiler.output_file": "File for the report; null prints it.",

    # ---------------------------------------------------------------- compression, MoQ
    "compression_training":
        "Compression library: quantization, pruning and layer reduction during training "
        "(`deepspeed.compression`).",
    "compression_training.*.shared_parameters": "Settings shared by every group of this technique.",
    "compression_training.*.shared_parameters.enabled": "Turn this technique on.",
    "compression_training.*.shared_parameters.schedule_offset":
        "Training step at which the technique starts.",
    "compression_training.*.different_groups":
        "Named groups of modules, each with its own parameters.",
    "compression_training.*.different_groups.<name>.modules":
        "Module-name patterns (regular expressions) the group applies to.",
    "compression_training.*.different_groups.<name>.related_modules":
        "For each matched module, the modules whose inputs shrink with it (pruning).",
    "compression_training.*.different_groups.<name>.params":
        "The technique's parameters for this group.",
    "compression_training.layer_reduction":
        "Layer reduction: initialize a shallower student from a teacher's layers.",
    "compression_training.layer_reduction.enabled": "Turn layer reduction on.",
    "compression_training.layer_reduction.keep_number_layer": "Number of layers the student keeps.",
    "compression_training.layer_reduction.module_name_prefix":
        "Name prefix of the layer list (e.g. `bert.encoder.layer`).",
    "compression_training.layer_reduction.teacher_layer":
        "Indices of the teacher layers copied into the student.",
    "compression_training.layer_reduction.other_module_name":
        "Other modules copied from the teacher (embeddings, pooler).",
    "compression_training.weight_quantization": "Quantize weights during training.",
    "compression_training.weight_quantization.shared_parameters.quantize_groups":
        "Groups per weight, each with its own scale.",
    "compression_training.weight_quantization.shared_parameters.quantize_verbose":
        "Log each change of bits.",
    "compression_training.weight_quantization.shared_parameters.quantization_type":
        "Symmetric or asymmetric (zero point) ranges.",
    "compression_training.weight_quantization.shared_parameters.rounding":
        "Nearest or stochastic rounding.",
    "compression_training.weight_quantization.shared_parameters.quantize_weight_in_forward":
        "Quantize in forward with a straight-through gradient; false quantizes the stored weights "
        "after each step.",
    "compression_training.weight_quantization.shared_parameters.fp16_mixed_quantize":
        "Blend full and quantized weights.",
    "compression_training.*.fp16_mixed_quantize.quantize_change_ratio":
        "How fast the blend moves towards the quantized weights.",
    "compression_training.weight_quantization.different_groups.<name>.params.start_bits":
        "Bits at the start of training.",
    "compression_training.weight_quantization.different_groups.<name>.params.target_bits":
        "Bits at the end of the schedule (1 = binary, 2 = ternary).",
    "compression_training.weight_quantization.different_groups.<name>.params.quantization_period":
        "Steps between two one-bit reductions.",
    "compression_training.activation_quantization": "Quantize activations during training.",
    "compression_training.activation_quantization.shared_parameters.quantization_type":
        "Symmetric or asymmetric (zero point) ranges.",
    "compression_training.activation_quantization.shared_parameters.range_calibration":
        "\"dynamic\": per-token ranges; \"static\": momentum-averaged ranges.",
    "compression_training.activation_quantization.different_groups.<name>.params.bits":
        "Activation bits.",
    "compression_training.sparse_pruning": "Unstructured or N:M weight pruning.",
    "compression_training.sparse_pruning.shared_parameters.schedule_offset_end":
        "Step at which dense_ratio is reached (snip_momentum).",
    "compression_training.sparse_pruning.shared_parameters.schedule_offset_stride":
        "Steps between mask updates (snip_momentum).",
    "compression_training.sparse_pruning.shared_parameters.method":
        "\"l1\" (magnitude), \"topk\" (learned scores) or \"snip_momentum\".",
    "compression_training.sparse_pruning.shared_parameters.block_pattern":
        "Block pattern of snip_momentum: \"NxM\" blocks or \"N:M\" structured.",
    "compression_training.sparse_pruning.shared_parameters.dense_ratio":
        "Fraction of weights kept at the end (snip_momentum).",
    "compression_training.sparse_pruning.shared_parameters.excluded_modules":
        "Module names never pruned.",
    "compression_training.row_pruning": "Prune whole output rows of linear layers.",
    "compression_training.head_pruning": "Prune whole attention heads.",
    "compression_training.channel_pruning": "Prune whole convolution channels.",
    "compression_training.*_pruning.shared_parameters.method":
        "How rows, heads or channels are ranked: \"l1\" magnitude or \"topk\" learned scores.",
    "compression_training.head_pruning.shared_parameters.num_heads":
        "Attention heads per layer (required for head pruning).",
    "quantize_training":
        "Mixture-of-quantization (MoQ): weights step down in bits during training.",
    "quantize_training.enabled": "Turn MoQ on.",
    "quantize_training.quantize_verbose": "Log each change of bits.",
    "quantize_training.quantize_type": "Symmetric or asymmetric (zero point) ranges.",
    "quantize_training.quantize_groups": "Groups per weight, each with its own scale.",
    "quantize_training.quantize_bits": "Start and target bits.",
    "quantize_training.quantize_bits.start_bits": "Bits at the start of training.",
    "quantize_training.quantize_bits.target_bits": "Bits at the end of the schedule.",
    "quantize_training.quantize_schedule": "When the bits change.",
    "quantize_training.quantize_schedule.quantize_period":
        "Steps before the first one-bit reduction; the period doubles after each reduction.",
    "quantize_training.quantize_schedule.schedule_offset": "Step at which quantization starts.",
    "quantize_training.quantize-algo": "Quantization algorithm (also spelled `quantize_algo`).",
    "quantize_training.quantize-algo.q_type": "Symmetric or asymmetric (zero point) ranges.",
    "quantize_training.quantize-algo.rounding": "Nearest or stochastic rounding.",
    "quantize_training.fp16_mixed_quantize": "Blend full and quantized weights.",
    "quantize_training.fp16_mixed_quantize.enabled": "Turn the blend on.",
    "quantize_training.fp16_mixed_quantize.quantize_change_ratio":
        "How fast the blend moves towards the quantized weights.",
    "quantize_training.eigenvalue":
        "Eigenvalue-based stretching of the quantization period (not implemented here; see "
        "`enabled`).",
    "quantize_training.eigenvalue.*":
        "A setting of the eigenvalue computation, which has no effect here (see "
        "`quantize_training.eigenvalue.enabled`).",

    # ---------------------------------------------------------------- data efficiency
    "curriculum_learning": "Legacy curriculum learning: the sequence length grows during training.",
    "curriculum_learning.curriculum_type": "What grows: only \"seqlen\" is supported.",
    "curriculum_learning.min_difficulty": "Sequence length at the start.",
    "curriculum_learning.max_difficulty": "Sequence length at the end.",
    "curriculum_learning.schedule_type":
        "\"fixed_linear\", \"fixed_root\", \"fixed_discrete\" or \"custom\".",
    "curriculum_learning.schedule_config":
        "Parameters of the schedule (total_curriculum_step, difficulty_step, root_degree, "
        "difficulty/max_step lists).",
    "data_efficiency": "Data efficiency library: curriculum data sampling and random-LTD.",
    "data_efficiency.seed": "Seed of the curriculum sampler.",
    "data_efficiency.data_sampling": "Curriculum data sampling.",
    "data_efficiency.data_sampling.num_epochs": "Epochs the sampler plans for.",
    "data_efficiency.data_sampling.num_workers": "Data loader worker processes.",
    "data_efficiency.data_sampling.pin_memory": "Pin the data loader's batches in host memory.",
    "data_efficiency.data_sampling.curriculum_learning":
        "Which samples are drawn as training proceeds.",
    "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics":
        "Difficulty metrics, by name.",
    "*.curriculum_metrics.<name>.index_to_sample_path":
        "Data analyzer output: samples by metric value.",
    "*.curriculum_metrics.<name>.index_to_metric_path": "Data analyzer output: the metric values.",
    "*.curriculum_metrics.<name>.difficulty_type":
        "\"value\": thresholds are metric values; \"percentile\": percentiles.",
    "*.curriculum_metrics.<name>.clustering_type":
        "\"schedule_based\" or \"single_cluster\" (a metric that does not change).",
    "*.curriculum_metrics.<name>.min_difficulty": "Difficulty at the start.",
    "*.curriculum_metrics.<name>.max_difficulty": "Difficulty at the end.",
    "*.curriculum_metrics.<name>.schedule_type":
        "\"fixed_linear\", \"fixed_root\", \"fixed_discrete\" or \"custom\".",
    "*.curriculum_metrics.<name>.schedule_config": "Parameters of the schedule.",
    "data_efficiency.data_routing": "Data routing (random-LTD).",
    "data_efficiency.data_routing.random_ltd":
        "Random layerwise token dropping: middle layers see a random subset of tokens.",
    "data_efficiency.data_routing.random_ltd.total_layer_num": "Layers of the model.",
    "data_efficiency.data_routing.random_ltd.random_ltd_layer_num": "Layers that drop tokens.",
    "data_efficiency.data_routing.random_ltd.random_ltd_layer_id": "Indices of those layers.",
    "data_efficiency.data_routing.random_ltd.model_mask_name":
        "Name of the attention-mask argument of the layers.",
    "data_efficiency.data_routing.random_ltd.model_type":
        "\"decoder\" (masks are sliced) or \"encoder\" (masks are gathered).",
    "data_efficiency.data_routing.random_ltd.hidden_state_order":
        "Layout of the hidden states: batch first or sequence first.",
    "data_efficiency.data_routing.random_ltd.random_ltd_schedule":
        "How many tokens are kept as training proceeds.",
    "data_efficiency.data_routing.random_ltd.random_ltd_schedule.min_value":
        "Tokens kept at the start.",
    "data_efficiency.data_routing.random_ltd.random_ltd_schedule.max_value":
        "Tokens kept at the end (the full sequence).",
    "data_efficiency.data_routing.random_ltd.random_ltd_schedule.schedule_type":
        "Only \"fixed_linear\".",
    "data_efficiency.data_routing.random_ltd.random_ltd_schedule.schedule_config":
        "require_steps and seq_per_step.",
    "progressive_layer_drop":
        "Progressive layer dropping: layers are skipped with a probability that grows during "
        "training.",
    "progressive_layer_drop.theta": "Lowest keep probability θ̄.",
    "progressive_layer_drop.gamma": "How fast the keep probability falls towards θ̄.",

    # ---------------------------------------------------------------- elasticity
    "elasticity.max_train_batch_size": "Largest global batch size the plan may choose.",
    "elasticity.micro_batch_sizes": "Micro-batch sizes a rank may use.",
    "elasticity.min_gpus": "Fewest GPUs (ranks) the job may run on.",
    "elasticity.max_gpus": "Most GPUs (ranks) the job may run on.",
    "elasticity.version": "Planning algorithm: 0.1 (GPU counts) or 0.2 (whole nodes).",
    "elasticity.ignore_non_elastic_batch_info":
        "Ignore batch keys beside the elasticity section instead of refusing them.",
    "elasticity.prefer_larger_batch": "Among equally good plans, choose the larger batch.",
    "elasticity.model_parallel_size": "Model-parallel size (version 0.2).",
    "elasticity.num_gpus_per_node": "GPUs per node (version 0.2).",

    # ------------------------------------------------------- sequence, sparse attention, TP
    "sequence_parallel_size": "Ranks one sequence is split over (Ulysses sequence parallelism).",
    "sparse_attention": "Pattern of block-sparse attention for `deepspeed.sparse_attention`.",
    "sparse_attention.mode":
        "Pattern family: \"dense\", \"fixed\", \"variable\", \"bigbird\" or \"bslongformer\".",
    "sparse_attention.block": "Block size: attention is computed on block x block tiles.",
    "sparse_attention.different_layout_per_head": "Give each head its own layout.",
    "sparse_attention.num_local_blocks": "Blocks in each local window (fixed).",
    "sparse_attention.num_global_blocks": "Global blocks per window (fixed).",
    "sparse_attention.attention": "\"bidirectional\" or \"unidirectional\" (causal).",
    "sparse_attention.horizontal_global_attention":
        "Global blocks also attend to every block (bidirectional only).",
    "sparse_attention.num_different_global_patterns":
        "Distinct global patterns across heads (fixed).",
    "sparse_attention.num_random_blocks": "Random blocks per row (variable, bigbird).",
    "sparse_attention.local_window_blocks": "Sizes of the successive local windows (variable).",
    "sparse_attention.global_block_indices":
        "Indices of the global blocks (variable, bslongformer).",
    "sparse_attention.global_block_end_indices":
        "Ends of global block ranges, pairing with global_block_indices.",
    "sparse_attention.num_sliding_window_blocks":
        "Blocks in the sliding window (bigbird, bslongformer).",
    "tensor_parallel.autotp_size":
        "Ranks one model is split over by AutoTP training (0 or 1: off); must divide the world "
        "size and the head counts.",
    "tensor_parallel.replace_with_kernel_inject":
        "Must be false: training uses no fused inference kernels.",
    "tensor_parallel.injection_policy_tuple":
        "Names of the row-parallel Linear layers (e.g. [\"o_proj\", \"down_proj\"]) when AutoTP "
        "cannot find them.",
    "tensor_parallel.tensor_parallel":
        "Upstream's inference-style block; only its defaults are accepted in training.",
    "tensor_parallel.tensor_parallel.tp_size":
        "Inference setting; for training set `tensor_parallel.autotp_size` (other values are an "
        "error).",
    "tensor_parallel.tensor_parallel.mpu": "Inference setting; must be null in training.",
    "tensor_parallel.tensor_parallel.tp_group": "Inference setting; must be null in training.",

    # ---------------------------------------------------------------- init_inference (its config)
    "init_inference.replace_with_kernel_inject":
        "SDPA attention and, on a GPU, the fused bias-GeLU of the MLP; on CPU AutoTP + SDPA.",
    "init_inference.dtype":
        "Convert the model to this dtype (torch.half/float/bfloat16, or int8 quantization). On "
        "the CPU accelerator the default fp16 keeps the model's own dtype.",
    "init_inference.tensor_parallel": "Tensor parallelism (AutoTP) of the inference engine.",
    "init_inference.tensor_parallel.enabled": "Whether to split the model at all.",
    "init_inference.tensor_parallel.tp_size": "Ranks one model is split over.",
    "init_inference.tensor_parallel.mpu":
        "A model-parallel unit whose model-parallel group and rank the split uses.",
    "init_inference.tensor_parallel.tp_group":
        "The process group to split over (its size must equal tp_size).",
    "init_inference.enable_cuda_graph":
        "Replay captured CUDA graphs for forward and greedy generate (GPU only).",
    "init_inference.use_triton":
        "Run the injected bias-GeLU as a Triton kernel (with replace_with_kernel_inject, GPU).",
    "init_inference.triton_autotune": "Autotune the Triton kernels' launch settings.",
    "init_inference.zero":
        "ZeRO-Inference: a zero_optimization section with stage 3; parameters are partitioned "
        "over the ranks and gathered module by module as the model runs.",
    "init_inference.triangular_masking": "The attention mask type of upstream's fused kernels.",
    "init_inference.moe": "Expert placement for models built from deepspeed.moe.layer.MoE.",
    "init_inference.moe.enabled": "Whether moe.ep_size asks for expert parallelism.",
    "init_inference.moe.ep_size": "Ranks the experts are spread over (the layers' ep_size).",
    "init_inference.moe.moe_experts": "Expected number of experts per MoE layer.",
    "init_inference.moe.type": "\"standard\" or \"residual\" (layers with use_residual).",
    "init_inference.moe.ep_group": "Expert-parallel process group of upstream's kernels.",
    "init_inference.moe.ep_mp_group": "Expert model-parallel group of upstream's kernels.",
    "init_inference.quant": "What dtype=torch.int8 quantizes (weights, layer inputs, q/k/v).",
    "init_inference.quant.enabled": "false keeps the model in floating point under int8.",
    "init_inference.quant.activation": "On-the-fly quantization of each quantized layer's input.",
    "init_inference.quant.activation.enabled": "Quantize the layers' inputs (the default).",
    "init_inference.quant.activation.num_bits": "Bits of the quantized inputs (2 to 8).",
    "init_inference.quant.activation.q_type": "\"symmetric\" or \"asymmetric\" grid.",
    "init_inference.quant.activation.q_groups":
        "Groups each token's features are cut into, one scale per group.",
    "init_inference.quant.weight": "int8 weights with per-group scales.",
    "init_inference.quant.weight.enabled": "Quantize the weights (the default).",
    "init_inference.quant.weight.num_bits": "Bits of the weight codes (8).",
    "init_inference.quant.weight.q_type": "\"symmetric\" or \"asymmetric\" (zero points).",
    "init_inference.quant.weight.q_groups": "Groups per output row, one scale per group.",
    "init_inference.quant.weight.quantized_initialization": "Upstream's per-layer quant table.",
    "init_inference.quant.weight.post_init_quant": "Upstream's per-layer quant table.",
    "init_inference.quant.qkv": "Quantization of the attention's q/k/v projections.",
    "init_inference.quant.qkv.enabled": "false keeps q/k/v projections in floating point.",
    "init_inference.checkpoint":
        "Weights to load into the (split) model: a ds_model JSON, an HF index, a directory or "
        "a file.",
    "init_inference.base_dir": "Directory the checkpoint's relative file names start from.",
    "init_inference.set_empty_params":
        "Empty every parameter before the checkpoint fills it (nothing of the built model kept).",
    "init_inference.save_mp_checkpoint_path": "Save the split model as a checkpoint.",
    "init_inference.checkpoint_config": "The checkpoint keys grouped (checkpoint_dir, ...).",
    "init_inference.checkpoint_config.checkpoint_dir": "Same as checkpoint.",
    "init_inference.checkpoint_config.save_mp_checkpoint_path": "Same as save_mp_checkpoint_path.",
    "init_inference.checkpoint_config.base_dir": "Same as base_dir.",
    "init_inference.return_tuple": "Whether upstream's injected layers return a tuple.",
    "init_inference.training_mp_size": "Model-parallel size the checkpoint was trained with.",
    "init_inference.replace_method": "Deprecated upstream; \"auto\".",
    "init_inference.injection_policy":
        "{block class: names of its row-parallel Linears} when AutoTP cannot find them.",
    "init_inference.injection_policy_tuple":
        "Row-parallel Linear names for replace_transformer_layer's orig_layer_impl.",
    "init_inference.config": "The model's configuration (upstream's kernels read it).",
    "init_inference.max_out_tokens": "Longest input (prompt) generate accepts, in tokens.",
    "init_inference.min_out_tokens":
        "generate refuses an input that leaves fewer new tokens than this within "
        "max_out_tokens.",
    "init_inference.transposed_mode": "Whether upstream's kernels take transposed weights.",
    "init_inference.mp_size": "Deprecated: tensor_parallel.tp_size.",
    "init_inference.mpu": "Deprecated: tensor_parallel.mpu.",
    "init_inference.ep_size": "Deprecated: moe.ep_size.",
    "init_inference.ep_group": "Deprecated: moe.ep_group.",
    "init_inference.ep_mp_group": "Deprecated: moe.ep_mp_group.",
    "init_inference.moe_experts": "Deprecated: moe.moe_experts.",
    "init_inference.moe_type": "Deprecated: moe.type.",
}
