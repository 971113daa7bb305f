# kai-opt scheduler image: `docker build -t kai-opt:$(python -c 'import kai_opt; print(kai_opt.__version__)') .`,
# then `helm install kai-opt deploy/helm/kai-opt` or `kai-opt manifests | kubectl apply --server-side -f -`.
#
# Base image: BASE_IMAGE names the tag; pin it to a digest for reproducible builds (README, Install and image):
#   docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm@sha256:<digest> ...
# and write the digest into the ARG below when refreshing it (the same for both stages).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# -- build: the locked dependencies (requirements.lock, sha256-checked, written by scripts/lock), then kai-opt --
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/kai-opt
ENV PATH=/opt/kai-opt/bin:$PATH
WORKDIR /src
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY kai_opt ./kai_opt
COPY models ./models
# kai-opt itself, without dependencies (all are in the lock); models/ too: `kai-opt bench` generates its instances
# from models.generators (plots need the bench extra, matplotlib, which the image leaves out)
RUN pip install --no-deps . && pip check

# -- runtime: the virtual environment only ------------------------------------------------------------------------
FROM ${BASE_IMAGE}
# numba compiles the cheapest-victims scan at its first use and caches it where it may write (the root file system
# is read-only; /tmp is an emptyDir, kept across the container's restarts)
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    PATH=/opt/kai-opt/bin:$PATH
COPY --from=build /opt/kai-opt /opt/kai-opt
# the Deployment runs as this non-root user with a read-only root file system (/tmp is an emptyDir)
USER 65532:65532
WORKDIR /
# the GPU reservation pods run this image too, as `python -m kai_opt.reservation` (kai_opt/reservation.py)
ENTRYPOINT ["kai-opt"]
CMD ["--help"]
