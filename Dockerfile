# kai-opt scheduler image: `docker build -t kai-opt:0.1.0 .`, then `kai-opt manifests | kubectl apply -f -`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY kai_opt ./kai_opt
RUN pip install . && rm -rf /src

# the Deployment runs as this non-root user with a read-only root file system (/tmp is an emptyDir)
USER 65532:65532
WORKDIR /
# the GPU reservation pods run this image too, as `python -m kai_opt.reservation` (kai_opt/reservation.py)
ENTRYPOINT ["kai-opt"]
CMD ["--help"]
