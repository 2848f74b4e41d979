# tooltrail worker image: `tooltrail worker` by default, `tooltrail db upgrade` for migrations.
#
#   docker build -t tooltrail .
#   docker run --rm -e TOOLTRAIL_TOOLS=tooltrail.cli.demo:host -e TOOLTRAIL_DATABASE_URL=... tooltrail
#
# Two stages: the builder installs the project (`pip install .`) into a virtualenv, the runtime
# stage copies only that virtualenv, so the source tree and build tools stay out of the image.

ARG PYTHON_VERSION=3.11

############################## build ##############################
FROM python:${PYTHON_VERSION}-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# .dockerignore keeps .venv, .git, caches, tests and local databases out of this copy.
COPY . .
# The model clients (optional extras) so `tooltrail worker` can serve agent runs.
RUN pip install --no-cache-dir ".[openai,anthropic]" \
    && python -c "from tooltrail.db.migrate import migrations_dir; print('migrations:', migrations_dir())"

############################## runtime ##############################
FROM python:${PYTHON_VERSION}-slim AS runtime

# tini runs as PID 1: it forwards SIGTERM/SIGINT (docker stop, scale-down) to the command and
# reaps zombie children (tools may start subprocesses). `tooltrail worker` stops on SIGTERM.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# Non-root user. Its home holds tooltrail's default data dir (used only for the embedded SQLite
# file, i.e. when TOOLTRAIL_DATABASE_URL is unset); session scratch dirs go to the temp dir (/tmp).
RUN groupadd --system --gid 10001 tooltrail \
    && useradd --system --uid 10001 --gid tooltrail --create-home --home-dir /home/tooltrail \
       --shell /usr/sbin/nologin tooltrail

COPY --from=build /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER tooltrail
# `--tools MODULE:ATTR` also imports from the working directory: a tools module mounted into /app
# (e.g. /app/my_tools.py -> TOOLTRAIL_TOOLS=my_tools:host) is found without rebuilding the image.
WORKDIR /app

# No HEALTHCHECK: a worker serves no port, it polls Temporal, so there is nothing cheap to probe
# beyond "the process is alive", which the restart policy already covers. A worker that cannot
# reach Temporal or finds the database unmigrated exits non-zero at startup; whether pollers are
# attached is visible in the Temporal UI (the task queue's page).

ENTRYPOINT ["tini", "--"]
CMD ["tooltrail", "worker"]
