# creditlens: CPU-only image.
#   docker build -t creditlens .
#   docker run -p 8000:8000 -v creditlens-data:/data creditlens
# Settings are CREDITLENS_* variables (-e CREDITLENS_DEMO=false: no demo data). A bind-mounted /data
# must be writable by uid 10001 (chown 10001 HOST_FOLDER).
# torch comes from the CPU index by default. From a local wheelhouse instead (a folder holding
# torch-2.13.0+cpu-*.whl), served to the build over the host's loopback:
#   python3 -m http.server -d WHEELHOUSE 8765 &
#   docker build --network=host --build-arg TORCH_PIP_ARGS="--find-links http://127.0.0.1:8765/" -t creditlens .
# Either way the build fails if the torch it got is a CUDA build.
FROM python:3.11-slim

ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    CREDITLENS_DATABASE_URL=sqlite:////data/creditlens.db \
    CREDITLENS_DEMO=true

RUN useradd --create-home --uid 10001 creditlens \
    && mkdir -p /data /app \
    && chown creditlens:creditlens /data

WORKDIR /app

# The dependencies first, from the two pyproject.toml files alone (the server's at the root, the
# client's in client/), so this big layer (torch and the rest, ~1 GB) is rebuilt when they change, not
# on every change to the code. Versions come from requirements.lock. The server's requirement on the
# client itself (`creditlens`) is left out here: the client is installed from client/ below. torch is
# pinned here and must be a CPU build (a CUDA one brings ~4 GB of nvidia-* packages): the build fails
# otherwise.
COPY pyproject.toml requirements.lock ./
COPY client/pyproject.toml ./client/pyproject.toml
# hadolint ignore=DL3013
RUN pip install -c requirements.lock torch==2.13.0 $TORCH_PIP_ARGS \
    && python -c "import re, subprocess, sys, tomllib; s = tomllib.load(open('pyproject.toml', 'rb'))['project']; c = tomllib.load(open('client/pyproject.toml', 'rb'))['project']; deps = [d for d in s['dependencies'] if re.split(r'[^A-Za-z0-9_.-]', d)[0].lower() != c['name']]; subprocess.check_call([sys.executable, '-m', 'pip', 'install', '-c', 'requirements.lock', *deps, *c['dependencies'], *s['optional-dependencies']['postgres']])" \
    && python -c "import importlib.metadata as md, torch; nv = sorted(d.metadata['Name'] for d in md.distributions() if d.metadata['Name'].lower().startswith('nvidia')); assert torch.version.cuda is None and not nv, f'torch {torch.__version__} is a CUDA build (with {nv}): this image is CPU-only; point TORCH_PIP_ARGS at CPU wheels'"

# Install step (replayed by tests/deploy/test_docker.py in a fresh venv, and built for real there):
# the client (client/, the `creditlens` distribution), then the server (`creditlens-server`).
COPY setup.py README.md ./
COPY client ./client
COPY app ./app
COPY estimators ./estimators
COPY templates ./templates
COPY static ./static
COPY fixtures ./fixtures
COPY alembic.ini ./
COPY migrations ./migrations
# gcc builds the GAE kernel (estimators/_native.c) and the JSON list reader (app/ingest/_numbers.c)
# and is removed again in the same layer, as are the build's leftovers in /app.
# hadolint ignore=DL3008,DL3013
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-deps ./client . \
    && pip check \
    && python -P -c "from estimators import native; assert native.available(), 'GAE kernel not built'" \
    && python -P -c "from app.ingest import _columns as c; assert c.compiled_available(), 'list reader not built'" \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* /app/build /app/*.egg-info /app/client/build /app/client/*.egg-info

USER 10001
VOLUME ["/data"]
EXPOSE 8000

# Probed every 5 s, so the container reads healthy within seconds of /healthz answering; the first
# minute's failures don't count (start-up), then 6 in a row (30 s) make it unhealthy.
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=6 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=3).status == 200 else 1)"]

# Start step (replayed by the same test). Demo data: CREDITLENS_DEMO (on unless set to false).
CMD ["creditlens", "serve", "--host", "0.0.0.0", "--port", "8000"]
