# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_wload_global_optspecs
    string join \n v/verbose q/quiet h/help V/version
end

function __fish_wload_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_wload_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_wload_using_subcommand
    set -l cmd (__fish_wload_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c wload -n "__fish_wload_needs_command" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_needs_command" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_needs_command" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_needs_command" -f -a "inspect" -d 'Show a checkpoint\'s files, config and tensors'
complete -c wload -n "__fish_wload_needs_command" -f -a "plan" -d 'Compute what every tensor-parallel rank holds, exactly as vLLM'
complete -c wload -n "__fish_wload_needs_command" -f -a "sizes" -d 'Which --tp, --pp and expert-parallel sizes vLLM accepts, and why not the others'
complete -c wload -n "__fish_wload_needs_command" -f -a "shard" -d 'Write pre-sharded per-rank safetensors files for vLLM\'s sharded_state loader'
complete -c wload -n "__fish_wload_needs_command" -f -a "load" -d 'Load a checkpoint into device memory per rank, timing every stage; --dry-run to debug'
complete -c wload -n "__fish_wload_needs_command" -f -a "completions" -d 'Print a shell completion script to stdout (bash, zsh, fish, elvish, powershell)'
complete -c wload -n "__fish_wload_needs_command" -f -a "man" -d 'Show the manual: wload(1), or with a subcommand\'s name its own page'
complete -c wload -n "__fish_wload_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c wload -n "__fish_wload_using_subcommand inspect" -l load-format -d 'Which weight files to read, as vLLM\'s --load-format' -r -f -a "auto\t'Mistral when a `consolidated*.safetensors` exists anywhere in the folder, else hf'
hf\t'`*.safetensors`, else `*.bin`, else `*.pt`'
safetensors\t'`*.safetensors` only'
mistral\t'`consolidated*.safetensors` with `consolidated.safetensors.index.json`'
pt\t'`*.pt` only'"
complete -c wload -n "__fish_wload_using_subcommand inspect" -l config-format -d 'Which config to read, as vLLM\'s --config-format' -r -f -a "auto\t'params.json when the folder has `consolidated*.safetensors` and a params.json, else config.json'
hf\t'Hugging Face config.json'
mistral\t'Mistral\'s params.json'"
complete -c wload -n "__fish_wload_using_subcommand inspect" -l hf-overrides -d 'JSON object applied on top of the model config, as vLLM\'s --hf-overrides' -r
complete -c wload -n "__fish_wload_using_subcommand inspect" -l revision -d 'Hub revision of a repo id: branch, tag or commit, as vLLM\'s --revision' -r
complete -c wload -n "__fish_wload_using_subcommand inspect" -l download-dir -d 'Hugging Face cache folder for a repo id, as vLLM\'s --download-dir (default: HF_HUB_CACHE, else $HF_HOME/hub)' -r -f -a "(__fish_complete_directories)"
complete -c wload -n "__fish_wload_using_subcommand inspect" -l filter -d 'Only list tensors whose name matches this regular expression (totals then cover those)' -r
complete -c wload -n "__fish_wload_using_subcommand inspect" -l mapping -d 'Mapping file whose structure (experts, dense layers, MTP layers) to describe, instead of the built-in one for the architecture (docs/mapping-format.md)' -r -F
complete -c wload -n "__fish_wload_using_subcommand inspect" -l json -d 'Print one JSON document instead of tables (schema: docs/inspect-json.md)'
complete -c wload -n "__fish_wload_using_subcommand inspect" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_using_subcommand inspect" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_using_subcommand inspect" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_using_subcommand inspect" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_using_subcommand plan" -l load-format -d 'Which weight files to read, as vLLM\'s --load-format' -r -f -a "auto\t'Mistral when a `consolidated*.safetensors` exists anywhere in the folder, else hf'
hf\t'`*.safetensors`, else `*.bin`, else `*.pt`'
safetensors\t'`*.safetensors` only'
mistral\t'`consolidated*.safetensors` with `consolidated.safetensors.index.json`'
pt\t'`*.pt` only'"
complete -c wload -n "__fish_wload_using_subcommand plan" -l config-format -d 'Which config to read, as vLLM\'s --config-format' -r -f -a "auto\t'params.json when the folder has `consolidated*.safetensors` and a params.json, else config.json'
hf\t'Hugging Face config.json'
mistral\t'Mistral\'s params.json'"
complete -c wload -n "__fish_wload_using_subcommand plan" -l hf-overrides -d 'JSON object applied on top of the model config, as vLLM\'s --hf-overrides' -r
complete -c wload -n "__fish_wload_using_subcommand plan" -l revision -d 'Hub revision of a repo id: branch, tag or commit, as vLLM\'s --revision' -r
complete -c wload -n "__fish_wload_using_subcommand plan" -l download-dir -d 'Hugging Face cache folder for a repo id, as vLLM\'s --download-dir (default: HF_HUB_CACHE, else $HF_HOME/hub)' -r -f -a "(__fish_complete_directories)"
complete -c wload -n "__fish_wload_using_subcommand plan" -s t -l tp -l tensor-parallel-size -d 'Tensor-parallel size (vLLM\'s --tensor-parallel-size)' -r
complete -c wload -n "__fish_wload_using_subcommand plan" -l pp -l pipeline-parallel-size -d 'Pipeline-parallel size (vLLM\'s --pipeline-parallel-size): ranks are pp_rank × tp + tp_rank' -r
complete -c wload -n "__fish_wload_using_subcommand plan" -l moe-backend -d 'The vLLM --moe-backend the experts are laid out for. MXFP4 experts padded as it pads them (triton, marlin, flashinfer_trtllm, flashinfer_cutlass, deep_gemm, cpu, emulation; default: unpadded slices, which load on every backend). ModelOpt NVFP4 experts under --enable-expert-parallel, required: a FlashInfer backend (flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl, flashinfer_b12x) holds every expert\'s input scales on every rank, the others (marlin, the H100/H200 default; cutlass, b12x, humming, flashinfer_moe_ep_cutedsl, emulation) the rank\'s own' -r
complete -c wload -n "__fish_wload_using_subcommand plan" -l dtype -d 'Model dtype, as vLLM\'s --dtype (auto: the config\'s, else the weights\' common dtype; float32 becomes bfloat16)' -r -f -a "auto\t'The config\'s dtype; float32 becomes bfloat16 (as vLLM on GPUs that support it)'
bfloat16\t''
float16\t''
float32\t''"
complete -c wload -n "__fish_wload_using_subcommand plan" -l mapping -d 'Mapping file to use instead of the built-in one for the architecture (docs/mapping-format.md)' -r -F
complete -c wload -n "__fish_wload_using_subcommand plan" -l mm-encoder-tp-mode -d 'Multimodal models: how the encoder uses tensor parallelism, as vLLM\'s --mm-encoder-tp-mode: weights (each layer split over the ranks, vLLM\'s default) or data (the whole encoder on every rank)' -r -f -a "weights\t'Each encoder layer\'s weights split over the TP ranks (vLLM\'s default)'
data\t'The whole encoder on every TP rank; the batch of images is split instead'"
complete -c wload -n "__fish_wload_using_subcommand plan" -l rank -d 'Show only this rank' -r
complete -c wload -n "__fish_wload_using_subcommand plan" -l enable-expert-parallel -d 'Spread MoE experts over the ranks instead of splitting each (vLLM\'s --enable-expert-parallel)'
complete -c wload -n "__fish_wload_using_subcommand plan" -l language-model-only -d 'Multimodal models: the language model only, without its vision (or audio) encoder, as vLLM\'s --language-model-only builds it; ignored for text-only models, as vLLM ignores it'
complete -c wload -n "__fish_wload_using_subcommand plan" -l json -d 'Print one JSON document instead of tables (schema: docs/plan-json.md)'
complete -c wload -n "__fish_wload_using_subcommand plan" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_using_subcommand plan" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_using_subcommand plan" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_using_subcommand plan" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_using_subcommand sizes" -l load-format -d 'Which weight files to read, as vLLM\'s --load-format' -r -f -a "auto\t'Mistral when a `consolidated*.safetensors` exists anywhere in the folder, else hf'
hf\t'`*.safetensors`, else `*.bin`, else `*.pt`'
safetensors\t'`*.safetensors` only'
mistral\t'`consolidated*.safetensors` with `consolidated.safetensors.index.json`'
pt\t'`*.pt` only'"
complete -c wload -n "__fish_wload_using_subcommand sizes" -l config-format -d 'Which config to read, as vLLM\'s --config-format' -r -f -a "auto\t'params.json when the folder has `consolidated*.safetensors` and a params.json, else config.json'
hf\t'Hugging Face config.json'
mistral\t'Mistral\'s params.json'"
complete -c wload -n "__fish_wload_using_subcommand sizes" -l hf-overrides -d 'JSON object applied on top of the model config, as vLLM\'s --hf-overrides' -r
complete -c wload -n "__fish_wload_using_subcommand sizes" -l revision -d 'Hub revision of a repo id: branch, tag or commit, as vLLM\'s --revision' -r
complete -c wload -n "__fish_wload_using_subcommand sizes" -l download-dir -d 'Hugging Face cache folder for a repo id, as vLLM\'s --download-dir (default: HF_HUB_CACHE, else $HF_HOME/hub)' -r -f -a "(__fish_complete_directories)"
complete -c wload -n "__fish_wload_using_subcommand sizes" -l max-tp -d 'The largest tensor-parallel size to check' -r
complete -c wload -n "__fish_wload_using_subcommand sizes" -l max-pp -d 'The largest pipeline-parallel size to check (never more than the layers)' -r
complete -c wload -n "__fish_wload_using_subcommand sizes" -l dtype -d 'Model dtype, as vLLM\'s --dtype (auto: the config\'s, else the weights\' common dtype; float32 becomes bfloat16)' -r -f -a "auto\t'The config\'s dtype; float32 becomes bfloat16 (as vLLM on GPUs that support it)'
bfloat16\t''
float16\t''
float32\t''"
complete -c wload -n "__fish_wload_using_subcommand sizes" -l mapping -d 'Mapping file to use instead of the built-in one for the architecture (docs/mapping-format.md)' -r -F
complete -c wload -n "__fish_wload_using_subcommand sizes" -l mm-encoder-tp-mode -d 'Multimodal models: how the encoder uses tensor parallelism, as vLLM\'s --mm-encoder-tp-mode: weights (each layer split over the ranks, vLLM\'s default) or data (the whole encoder on every rank)' -r -f -a "weights\t'Each encoder layer\'s weights split over the TP ranks (vLLM\'s default)'
data\t'The whole encoder on every TP rank; the batch of images is split instead'"
complete -c wload -n "__fish_wload_using_subcommand sizes" -l language-model-only -d 'Multimodal models: the language model only, without its vision (or audio) encoder, as vLLM\'s --language-model-only builds it; ignored for text-only models, as vLLM ignores it'
complete -c wload -n "__fish_wload_using_subcommand sizes" -l json -d 'Print one JSON document instead of a table (schema: docs/sizes-json.md)'
complete -c wload -n "__fish_wload_using_subcommand sizes" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_using_subcommand sizes" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_using_subcommand sizes" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_using_subcommand sizes" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_using_subcommand shard" -l load-format -d 'Which weight files to read, as vLLM\'s --load-format' -r -f -a "auto\t'Mistral when a `consolidated*.safetensors` exists anywhere in the folder, else hf'
hf\t'`*.safetensors`, else `*.bin`, else `*.pt`'
safetensors\t'`*.safetensors` only'
mistral\t'`consolidated*.safetensors` with `consolidated.safetensors.index.json`'
pt\t'`*.pt` only'"
complete -c wload -n "__fish_wload_using_subcommand shard" -l config-format -d 'Which config to read, as vLLM\'s --config-format' -r -f -a "auto\t'params.json when the folder has `consolidated*.safetensors` and a params.json, else config.json'
hf\t'Hugging Face config.json'
mistral\t'Mistral\'s params.json'"
complete -c wload -n "__fish_wload_using_subcommand shard" -l hf-overrides -d 'JSON object applied on top of the model config, as vLLM\'s --hf-overrides' -r
complete -c wload -n "__fish_wload_using_subcommand shard" -l revision -d 'Hub revision of a repo id: branch, tag or commit, as vLLM\'s --revision' -r
complete -c wload -n "__fish_wload_using_subcommand shard" -l download-dir -d 'Hugging Face cache folder for a repo id, as vLLM\'s --download-dir (default: HF_HUB_CACHE, else $HF_HOME/hub)' -r -f -a "(__fish_complete_directories)"
complete -c wload -n "__fish_wload_using_subcommand shard" -s t -l tp -l tensor-parallel-size -d 'Tensor-parallel size (vLLM\'s --tensor-parallel-size)' -r
complete -c wload -n "__fish_wload_using_subcommand shard" -l pp -l pipeline-parallel-size -d 'Pipeline-parallel size (vLLM\'s --pipeline-parallel-size): ranks are pp_rank × tp + tp_rank' -r
complete -c wload -n "__fish_wload_using_subcommand shard" -l moe-backend -d 'The vLLM --moe-backend the experts are laid out for. MXFP4 experts padded as it pads them (triton, marlin, flashinfer_trtllm, flashinfer_cutlass, deep_gemm, cpu, emulation; default: unpadded slices, which load on every backend). ModelOpt NVFP4 experts under --enable-expert-parallel, required: a FlashInfer backend (flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl, flashinfer_b12x) holds every expert\'s input scales on every rank, the others (marlin, the H100/H200 default; cutlass, b12x, humming, flashinfer_moe_ep_cutedsl, emulation) the rank\'s own' -r
complete -c wload -n "__fish_wload_using_subcommand shard" -l dtype -d 'Model dtype, as vLLM\'s --dtype (auto: the config\'s, else the weights\' common dtype; float32 becomes bfloat16)' -r -f -a "auto\t'The config\'s dtype; float32 becomes bfloat16 (as vLLM on GPUs that support it)'
bfloat16\t''
float16\t''
float32\t''"
complete -c wload -n "__fish_wload_using_subcommand shard" -l mapping -d 'Mapping file to use instead of the built-in one for the architecture (docs/mapping-format.md)' -r -F
complete -c wload -n "__fish_wload_using_subcommand shard" -l mm-encoder-tp-mode -d 'Multimodal models: how the encoder uses tensor parallelism, as vLLM\'s --mm-encoder-tp-mode: weights (each layer split over the ranks, vLLM\'s default) or data (the whole encoder on every rank)' -r -f -a "weights\t'Each encoder layer\'s weights split over the TP ranks (vLLM\'s default)'
data\t'The whole encoder on every TP rank; the batch of images is split instead'"
complete -c wload -n "__fish_wload_using_subcommand shard" -s o -l output -d 'Output folder: new or empty (or, with --force, an earlier wload output)' -r -f -a "(__fish_complete_directories)"
complete -c wload -n "__fish_wload_using_subcommand shard" -l max-part-size -d 'Largest data size of one part file: bytes (40000) or with a unit (500MB, 5GiB)' -r
complete -c wload -n "__fish_wload_using_subcommand shard" -l ranks -d 'Write only these ranks, e.g. 0-3 or 0,2,5 (to split one job across machines); or `launcher`: this run\'s contiguous share of them, from torchrun (RANK/WORLD_SIZE), srun (SLURM_PROCID/SLURM_NTASKS), a Slurm array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, with WLOAD_RUNS set to its completions)' -r
complete -c wload -n "__fish_wload_using_subcommand shard" -l io -d 'How to read the source: auto, buffered, direct (O_DIRECT), or mmap' -r -f -a "auto\t'Direct when most of the source is out of the page cache, buffered when it is in'
buffered\t'pread through the page cache'
direct\t'O_DIRECT reads into aligned buffers: no page-cache copy, no cache pollution'
mmap\t'Copies out of a read-only mapping of each file'"
complete -c wload -n "__fish_wload_using_subcommand shard" -l enable-expert-parallel -d 'Spread MoE experts over the ranks instead of splitting each (vLLM\'s --enable-expert-parallel)'
complete -c wload -n "__fish_wload_using_subcommand shard" -l language-model-only -d 'Multimodal models: the language model only, without its vision (or audio) encoder, as vLLM\'s --language-model-only builds it; ignored for text-only models, as vLLM ignores it'
complete -c wload -n "__fish_wload_using_subcommand shard" -l force -d 'Replace OUT if it is an earlier wload output (only once the new output is complete)'
complete -c wload -n "__fish_wload_using_subcommand shard" -l verify -d 'Read every written byte back and compare it with the source before publishing OUT'
complete -c wload -n "__fish_wload_using_subcommand shard" -l cold -d 'Drop the source files from the page cache first (posix_fadvise), checked with mincore'
complete -c wload -n "__fish_wload_using_subcommand shard" -l json -d 'Print a JSON report (the manifest, sizes, timings) instead of a summary (schema: docs/shard-json.md)'
complete -c wload -n "__fish_wload_using_subcommand shard" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_using_subcommand shard" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_using_subcommand shard" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_using_subcommand shard" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_using_subcommand load" -l load-format -d 'Which weight files to read, as vLLM\'s --load-format' -r -f -a "auto\t'Mistral when a `consolidated*.safetensors` exists anywhere in the folder, else hf'
hf\t'`*.safetensors`, else `*.bin`, else `*.pt`'
safetensors\t'`*.safetensors` only'
mistral\t'`consolidated*.safetensors` with `consolidated.safetensors.index.json`'
pt\t'`*.pt` only'"
complete -c wload -n "__fish_wload_using_subcommand load" -l config-format -d 'Which config to read, as vLLM\'s --config-format' -r -f -a "auto\t'params.json when the folder has `consolidated*.safetensors` and a params.json, else config.json'
hf\t'Hugging Face config.json'
mistral\t'Mistral\'s params.json'"
complete -c wload -n "__fish_wload_using_subcommand load" -l hf-overrides -d 'JSON object applied on top of the model config, as vLLM\'s --hf-overrides' -r
complete -c wload -n "__fish_wload_using_subcommand load" -l revision -d 'Hub revision of a repo id: branch, tag or commit, as vLLM\'s --revision' -r
complete -c wload -n "__fish_wload_using_subcommand load" -l download-dir -d 'Hugging Face cache folder for a repo id, as vLLM\'s --download-dir (default: HF_HUB_CACHE, else $HF_HOME/hub)' -r -f -a "(__fish_complete_directories)"
complete -c wload -n "__fish_wload_using_subcommand load" -s t -l tp -l tensor-parallel-size -d 'Tensor-parallel size (vLLM\'s --tensor-parallel-size); default: the one in SOURCE\'s wload.json' -r
complete -c wload -n "__fish_wload_using_subcommand load" -l pp -l pipeline-parallel-size -d 'Pipeline-parallel size (vLLM\'s --pipeline-parallel-size); default: wload.json\'s, else 1' -r
complete -c wload -n "__fish_wload_using_subcommand load" -l dtype -d 'Model dtype, as vLLM\'s --dtype; default: wload.json\'s, else auto (the config\'s)' -r -f -a "auto\t'The config\'s dtype; float32 becomes bfloat16 (as vLLM on GPUs that support it)'
bfloat16\t''
float16\t''
float32\t''"
complete -c wload -n "__fish_wload_using_subcommand load" -l moe-backend -d 'The vLLM --moe-backend the experts are laid out for. MXFP4 experts padded as it pads them (triton, marlin, flashinfer_trtllm, flashinfer_cutlass, deep_gemm, cpu, emulation; default: unpadded slices, which load on every backend). ModelOpt NVFP4 experts under --enable-expert-parallel, required: a FlashInfer backend (flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl, flashinfer_b12x) holds every expert\'s input scales on every rank, the others (marlin, the H100/H200 default; cutlass, b12x, humming, flashinfer_moe_ep_cutedsl, emulation) the rank\'s own' -r
complete -c wload -n "__fish_wload_using_subcommand load" -l mm-encoder-tp-mode -d 'Multimodal models: the encoder\'s TP mode, as vLLM\'s --mm-encoder-tp-mode (weights, data); default: wload.json\'s, else weights' -r -f -a "weights\t'Each encoder layer\'s weights split over the TP ranks (vLLM\'s default)'
data\t'The whole encoder on every TP rank; the batch of images is split instead'"
complete -c wload -n "__fish_wload_using_subcommand load" -l mapping -d 'Mapping file to use instead of the built-in one for the architecture (docs/mapping-format.md)' -r -F
complete -c wload -n "__fish_wload_using_subcommand load" -l device -d 'Where to load: GPUs through the CUDA driver, or host memory' -r -f -a "cuda\t''
cpu\t''"
complete -c wload -n "__fish_wload_using_subcommand load" -l ranks -d 'Load only these ranks, e.g. 0-3 (default: from RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS, else all)' -r
complete -c wload -n "__fish_wload_using_subcommand load" -l io -d 'How to read the source: auto, buffered, direct (O_DIRECT), or mmap' -r -f -a "auto\t'Direct when most of the source is out of the page cache, buffered when it is in'
buffered\t'pread through the page cache'
direct\t'O_DIRECT reads into aligned buffers: no page-cache copy, no cache pollution'
mmap\t'Copies out of a read-only mapping of each file'"
complete -c wload -n "__fish_wload_using_subcommand load" -l repeat -d 'Load N times and report min/median/max (with --cold, each load starts cold)' -r
complete -c wload -n "__fish_wload_using_subcommand load" -l enable-expert-parallel -d 'Spread MoE experts over the ranks (vLLM\'s --enable-expert-parallel); default: wload.json\'s'
complete -c wload -n "__fish_wload_using_subcommand load" -l language-model-only -d 'Multimodal models: the language model only, as vLLM\'s --language-model-only; default: wload.json\'s'
complete -c wload -n "__fish_wload_using_subcommand load" -l dry-run -d 'Check everything vLLM would check, without touching a device'
complete -c wload -n "__fish_wload_using_subcommand load" -l read -d 'With --dry-run: also read every byte and checksum it (and compare with wload.json)'
complete -c wload -n "__fish_wload_using_subcommand load" -l check -d 'Copy every tensor back from the device and compare it with the host\'s bytes'
complete -c wload -n "__fish_wload_using_subcommand load" -l checksums -d 'Report an XXH3-64 checksum of every loaded tensor'
complete -c wload -n "__fish_wload_using_subcommand load" -l cold -d 'Drop the source files from the page cache first (posix_fadvise), checked with mincore'
complete -c wload -n "__fish_wload_using_subcommand load" -l json -d 'Print one JSON document instead of tables (schema: docs/load-json.md)'
complete -c wload -n "__fish_wload_using_subcommand load" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_using_subcommand load" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_using_subcommand load" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_using_subcommand load" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_using_subcommand completions" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_using_subcommand completions" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_using_subcommand completions" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_using_subcommand completions" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_using_subcommand man" -s v -l verbose -d 'Print more detail: how things were found and read, not only what'
complete -c wload -n "__fish_wload_using_subcommand man" -s q -l quiet -d 'Print only results and errors: no progress bars, notes or warnings'
complete -c wload -n "__fish_wload_using_subcommand man" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c wload -n "__fish_wload_using_subcommand man" -s V -l version -d 'Print version'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "inspect" -d 'Show a checkpoint\'s files, config and tensors'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "plan" -d 'Compute what every tensor-parallel rank holds, exactly as vLLM'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "sizes" -d 'Which --tp, --pp and expert-parallel sizes vLLM accepts, and why not the others'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "shard" -d 'Write pre-sharded per-rank safetensors files for vLLM\'s sharded_state loader'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "load" -d 'Load a checkpoint into device memory per rank, timing every stage; --dry-run to debug'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "completions" -d 'Print a shell completion script to stdout (bash, zsh, fish, elvish, powershell)'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "man" -d 'Show the manual: wload(1), or with a subcommand\'s name its own page'
complete -c wload -n "__fish_wload_using_subcommand help; and not __fish_seen_subcommand_from inspect plan sizes shard load completions man help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
