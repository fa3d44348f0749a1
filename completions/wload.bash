_wload() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="wload"
                ;;
            wload,completions)
                cmd="wload__subcmd__completions"
                ;;
            wload,help)
                cmd="wload__subcmd__help"
                ;;
            wload,inspect)
                cmd="wload__subcmd__inspect"
                ;;
            wload,load)
                cmd="wload__subcmd__load"
                ;;
            wload,man)
                cmd="wload__subcmd__man"
                ;;
            wload,plan)
                cmd="wload__subcmd__plan"
                ;;
            wload,shard)
                cmd="wload__subcmd__shard"
                ;;
            wload,sizes)
                cmd="wload__subcmd__sizes"
                ;;
            wload__subcmd__help,completions)
                cmd="wload__subcmd__help__subcmd__completions"
                ;;
            wload__subcmd__help,help)
                cmd="wload__subcmd__help__subcmd__help"
                ;;
            wload__subcmd__help,inspect)
                cmd="wload__subcmd__help__subcmd__inspect"
                ;;
            wload__subcmd__help,load)
                cmd="wload__subcmd__help__subcmd__load"
                ;;
            wload__subcmd__help,man)
                cmd="wload__subcmd__help__subcmd__man"
                ;;
            wload__subcmd__help,plan)
                cmd="wload__subcmd__help__subcmd__plan"
                ;;
            wload__subcmd__help,shard)
                cmd="wload__subcmd__help__subcmd__shard"
                ;;
            wload__subcmd__help,sizes)
                cmd="wload__subcmd__help__subcmd__sizes"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        wload)
            opts="-v -q -h -V --verbose --quiet --help --version inspect plan sizes shard load completions man help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__completions)
            opts="-v -q -h -V --verbose --quiet --help --version bash elvish fish powershell zsh"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help)
            opts="inspect plan sizes shard load completions man help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__completions)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__inspect)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__load)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__man)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__plan)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__shard)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__help__subcmd__sizes)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__inspect)
            opts="-v -q -h -V --load-format --config-format --hf-overrides --revision --download-dir --filter --json --mapping --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --load-format)
                    COMPREPLY=($(compgen -W "auto hf safetensors mistral pt" -- "${cur}"))
                    return 0
                    ;;
                --config-format)
                    COMPREPLY=($(compgen -W "auto hf mistral" -- "${cur}"))
                    return 0
                    ;;
                --hf-overrides)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --download-dir)
                    COMPREPLY=()
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o plusdirs
                    fi
                    return 0
                    ;;
                --filter)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mapping)
                    local oldifs
                    if [ -n "${IFS+x}" ]; then
                        oldifs="$IFS"
                    fi
                    IFS=$'\n'
                    COMPREPLY=($(compgen -f "${cur}"))
                    if [ -n "${oldifs+x}" ]; then
                        IFS="$oldifs"
                    fi
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o filenames
                    fi
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__load)
            opts="-t -v -q -h -V --load-format --config-format --hf-overrides --revision --download-dir --tensor-parallel-size --tp --pipeline-parallel-size --pp --enable-expert-parallel --dtype --moe-backend --language-model-only --mm-encoder-tp-mode --mapping --device --dry-run --read --ranks --check --checksums --io --cold --repeat --json --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --load-format)
                    COMPREPLY=($(compgen -W "auto hf safetensors mistral pt" -- "${cur}"))
                    return 0
                    ;;
                --config-format)
                    COMPREPLY=($(compgen -W "auto hf mistral" -- "${cur}"))
                    return 0
                    ;;
                --hf-overrides)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --download-dir)
                    COMPREPLY=()
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o plusdirs
                    fi
                    return 0
                    ;;
                --tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tensor-parallel-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -t)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pipeline-parallel-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "auto bfloat16 float16 float32" -- "${cur}"))
                    return 0
                    ;;
                --moe-backend)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --mm-encoder-tp-mode)
                    COMPREPLY=($(compgen -W "weights data" -- "${cur}"))
                    return 0
                    ;;
                --mapping)
                    local oldifs
                    if [ -n "${IFS+x}" ]; then
                        oldifs="$IFS"
                    fi
                    IFS=$'\n'
                    COMPREPLY=($(compgen -f "${cur}"))
                    if [ -n "${oldifs+x}" ]; then
                        IFS="$oldifs"
                    fi
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o filenames
                    fi
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "cuda cpu" -- "${cur}"))
                    return 0
                    ;;
                --ranks)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --io)
                    COMPREPLY=($(compgen -W "auto buffered direct mmap" -- "${cur}"))
                    return 0
                    ;;
                --repeat)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__man)
            opts="-v -q -h -V --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__plan)
            opts="-t -v -q -h -V --load-format --config-format --hf-overrides --revision --download-dir --tensor-parallel-size --tp --pipeline-parallel-size --pp --enable-expert-parallel --moe-backend --dtype --mapping --language-model-only --mm-encoder-tp-mode --rank --json --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --load-format)
                    COMPREPLY=($(compgen -W "auto hf safetensors mistral pt" -- "${cur}"))
                    return 0
                    ;;
                --config-format)
                    COMPREPLY=($(compgen -W "auto hf mistral" -- "${cur}"))
                    return 0
                    ;;
                --hf-overrides)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --download-dir)
                    COMPREPLY=()
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o plusdirs
                    fi
                    return 0
                    ;;
                --tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tensor-parallel-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -t)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pipeline-parallel-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --moe-backend)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "auto bfloat16 float16 float32" -- "${cur}"))
                    return 0
                    ;;
                --mapping)
                    local oldifs
                    if [ -n "${IFS+x}" ]; then
                        oldifs="$IFS"
                    fi
                    IFS=$'\n'
                    COMPREPLY=($(compgen -f "${cur}"))
                    if [ -n "${oldifs+x}" ]; then
                        IFS="$oldifs"
                    fi
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o filenames
                    fi
                    return 0
                    ;;
                --mm-encoder-tp-mode)
                    COMPREPLY=($(compgen -W "weights data" -- "${cur}"))
                    return 0
                    ;;
                --rank)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__shard)
            opts="-t -o -v -q -h -V --load-format --config-format --hf-overrides --revision --download-dir --tensor-parallel-size --tp --pipeline-parallel-size --pp --enable-expert-parallel --moe-backend --dtype --mapping --language-model-only --mm-encoder-tp-mode --output --max-part-size --ranks --force --verify --io --cold --json --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --load-format)
                    COMPREPLY=($(compgen -W "auto hf safetensors mistral pt" -- "${cur}"))
                    return 0
                    ;;
                --config-format)
                    COMPREPLY=($(compgen -W "auto hf mistral" -- "${cur}"))
                    return 0
                    ;;
                --hf-overrides)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --download-dir)
                    COMPREPLY=()
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o plusdirs
                    fi
                    return 0
                    ;;
                --tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tensor-parallel-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -t)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pipeline-parallel-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --moe-backend)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "auto bfloat16 float16 float32" -- "${cur}"))
                    return 0
                    ;;
                --mapping)
                    local oldifs
                    if [ -n "${IFS+x}" ]; then
                        oldifs="$IFS"
                    fi
                    IFS=$'\n'
                    COMPREPLY=($(compgen -f "${cur}"))
                    if [ -n "${oldifs+x}" ]; then
                        IFS="$oldifs"
                    fi
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o filenames
                    fi
                    return 0
                    ;;
                --mm-encoder-tp-mode)
                    COMPREPLY=($(compgen -W "weights data" -- "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=()
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o plusdirs
                    fi
                    return 0
                    ;;
                -o)
                    COMPREPLY=()
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o plusdirs
                    fi
                    return 0
                    ;;
                --max-part-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ranks)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --io)
                    COMPREPLY=($(compgen -W "auto buffered direct mmap" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        wload__subcmd__sizes)
            opts="-v -q -h -V --load-format --config-format --hf-overrides --revision --download-dir --max-tp --max-pp --dtype --mapping --language-model-only --mm-encoder-tp-mode --json --verbose --quiet --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --load-format)
                    COMPREPLY=($(compgen -W "auto hf safetensors mistral pt" -- "${cur}"))
                    return 0
                    ;;
                --config-format)
                    COMPREPLY=($(compgen -W "auto hf mistral" -- "${cur}"))
                    return 0
                    ;;
                --hf-overrides)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --download-dir)
                    COMPREPLY=()
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o plusdirs
                    fi
                    return 0
                    ;;
                --max-tp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-pp)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "auto bfloat16 float16 float32" -- "${cur}"))
                    return 0
                    ;;
                --mapping)
                    local oldifs
                    if [ -n "${IFS+x}" ]; then
                        oldifs="$IFS"
                    fi
                    IFS=$'\n'
                    COMPREPLY=($(compgen -f "${cur}"))
                    if [ -n "${oldifs+x}" ]; then
                        IFS="$oldifs"
                    fi
                    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
                        compopt -o filenames
                    fi
                    return 0
                    ;;
                --mm-encoder-tp-mode)
                    COMPREPLY=($(compgen -W "weights data" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _wload -o nosort -o bashdefault -o default wload
else
    complete -F _wload -o bashdefault -o default wload
fi
