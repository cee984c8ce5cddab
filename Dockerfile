# Image for every pod of ray-cluster.yaml: the official Ray image plus this project.
#
#   GPU trainers (default):
#     docker build -t registry.example.com/elastic:ray2.60.0-py311-gpu .
#   Head and CPU reward workers (no CUDA, smaller, faster to pull):
#     docker build --build-arg RAY_IMAGE_SUFFIX= \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#       -t registry.example.com/elastic:ray2.60.0-py311-cpu .
#   Optional FlashAttention (GPU image only; a CUDA source build, ~1 h without a prebuilt wheel;
#   the model falls back to torch varlen / SDPA attention without it):
#     docker build --build-arg WITH_FLASH_ATTN=1 -t registry.example.com/elastic:ray2.60.0-py311-gpu .
#
# RAY_VERSION must equal `rayVersion` in ray-cluster.yaml and jobs/k8s/*.yaml and the image
# tags there (tests/test_manifests.py checks all three). Bump them together.
ARG RAY_VERSION=2.60.0
ARG PYTHON_TAG=py311
# "-gpu" = CUDA base image for the trainer group; "" = CPU image.
ARG RAY_IMAGE_SUFFIX=-gpu
FROM rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}${RAY_IMAGE_SUFFIX}

ARG RAY_VERSION
ARG TORCH_VERSION=2.13.0
# Empty: PyPI's default (CUDA) torch wheel. The CPU image passes PyTorch's CPU index.
ARG TORCH_INDEX_URL=
ARG WITH_FLASH_ATTN=0

# The reward sandbox needs bubblewrap and a C/C++ toolchain (same set as scripts/setup.sh).
USER root
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap gcc g++ \
 && rm -rf /var/lib/apt/lists/*
USER ray

WORKDIR /home/ray/elastic

# torch first, in its own layer: it is most of the image and changes least often.
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
      pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"; \
    else \
      pip install --no-cache-dir "torch==${TORCH_VERSION}"; \
    fi

# The library, installed (not editable) so any Ray worker process can import it. Ray itself is
# pinned to the base image's version: pip must never replace the Ray the image was built for.
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users elastic ./elastic
RUN pip install --no-cache-dir . "ray[default,train,data]==${RAY_VERSION}" \
 && if [ "$WITH_FLASH_ATTN" = "1" ]; then \
      pip install --no-cache-dir --no-build-isolation "flash-attn>=2.6"; \
    fi \
 && python -c "import ray, torch, elastic; assert ray.__version__ == '${RAY_VERSION}', ray.__version__"

# Entry points and configs: RayJob entrypoints call /home/ray/elastic/jobs/<name>.py.
COPY --chown=ray:users jobs ./jobs
COPY --chown=ray:users scripts ./scripts

LABEL org.opencontainers.image.title="elastic" \
      io.ray.version="${RAY_VERSION}"
