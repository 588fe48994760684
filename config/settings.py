"""Django settings, driven by environment variables (see the README's Configuration section)."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from config.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_str,
    env_url,
    load_secret_files,
)

load_secret_files()  # MYRIAD_SECRET_KEY_FILE and the like: secrets from mounted files

BASE_DIR = Path(__file__).resolve().parent.parent


def _separate_test_worker(environ=os.environ) -> None:
    """Parallel test processes (pytest-xdist names each one in PYTEST_XDIST_WORKER, gw0, gw1 ...)
    each get a data folder (SQLite file, embedded broker) and a Redis database of their own, so no
    two share a live store, a cache or a queue. The choice is written back to the environment, so
    the processes a test starts use the same ones; they do not move again."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit() or environ.get("MYRIAD_TEST_WORKER"):
        return
    index = int(worker[2:])
    environ["MYRIAD_TEST_WORKER"] = worker
    environ["MYRIAD_DATA_DIR"] = str(Path(environ.get("MYRIAD_DATA_DIR", str(BASE_DIR / "var"))) / worker)
    url = environ.get("MYRIAD_REDIS_URL", "")
    if url.startswith("redis://") and index:
        base, _, db = url.rpartition("/")
        if db.isdigit() and base != "redis:/":  # redis://host:port/DB: the databases below DB
            environ["MYRIAD_REDIS_URL"] = f"{base}/{int(db) - index}"


_separate_test_worker()
DATA_DIR = Path(env_str("MYRIAD_DATA_DIR", str(BASE_DIR / "var")))
DATA_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("MYRIAD_DEBUG", False)
SECRET_KEY = env_str("MYRIAD_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and env_bool("MYRIAD_REQUIRE_SECRET_KEY", False):
        from config.env import ConfigError

        raise ConfigError("MYRIAD_SECRET_KEY must be set when MYRIAD_REQUIRE_SECRET_KEY is on")
    # A fixed development key; production sets MYRIAD_SECRET_KEY.
    SECRET_KEY = "myriad-development-key-not-for-production"
ALLOWED_HOSTS = env_list("MYRIAD_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

# --- HTTPS behind a proxy (docs/deploy.md): the proxy ends TLS and says so in X-Forwarded-Proto --
if env_bool("MYRIAD_HTTPS", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^metrics", r"^api/v1/agent/"]  # scrapes and agents may use plain HTTP inside
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("MYRIAD_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("MYRIAD_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = env_bool("MYRIAD_HSTS_PRELOAD", False)
    CSRF_TRUSTED_ORIGINS = [f"https://{h}" for h in ALLOWED_HOSTS if h not in ("*",)]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "channels",
    "cluster",
    "scheduling",
    "monitoring",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "cluster.outages.DatabaseOutageMiddleware",  # a lost database: 503 with a reason
]

ROOT_URLCONF = "config.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "cluster.context_processors.roles",
            ]
        },
    }
]
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_url(
    "MYRIAD_DATABASE_URL",
    f"sqlite:///{DATA_DIR / 'myriad.sqlite3'}",
    schemes=("sqlite", "postgres", "postgresql"),
)
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_health_checks=True)}
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # A pool of connections per process (psycopg's): the ASGI server runs each request on a
    # thread of its own, and a connection kept per thread would hold one server connection per
    # thread ever used (a few hundred submits a second exhaust max_connections). A connection is
    # checked as it leaves the pool (the health checks), so one a database restart broke is
    # replaced, not handed out.
    DATABASES["default"]["OPTIONS"] = {
        "pool": {
            "min_size": 1,
            "max_size": env_int("MYRIAD_DB_POOL_SIZE", 20, minimum=2),
            "timeout": 10,
        },
        # pg_stat_activity and pg_locks name the process behind each connection (who holds the
        # scheduling lock, for one)
        "application_name": f"myriad:{os.getpid()}",
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Django's backend, with a writer waiting for the write lock asking every 2 ms (config/sqlite3)
    DATABASES["default"]["ENGINE"] = "config.sqlite3"
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the dashboard read while a worker writes; IMMEDIATE takes the write lock at
        # BEGIN so two writers queue instead of failing on a lock upgrade.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test-myriad.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, Celery broker, live store ----------------------------------------
REDIS_URL = env_url("MYRIAD_REDIS_URL", None, schemes=("redis", "rediss"))
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # The pub/sub layer fans one group message out to many clients far faster than the
            # list-based default layer.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # redis-py 8 caps an async pool at 100 connections and fails fast beyond it; commands
            # of one server process (publishes, subscribes) share this pool
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        "max_connections": env_int("MYRIAD_REDIS_MAX_CONNECTIONS", 1000, minimum=10),
                    }
                ]
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    _broker_dir = DATA_DIR / "celery-broker"
    for sub in ("out", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"  # kombu's, with atomic message writes
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "data_folder_processed": str(_broker_dir / "processed"),
        # the exchange tables live with the messages, never in the working directory
        "control_folder": str(_broker_dir / "control"),
        # the file-system transport polls its folder: a submit is seen within 20 ms (polling costs an
        # idle worker 1-2% of a core; 50 ms: 0.6%, 10 ms: 2.6%)
        "polling_interval": 0.02,
    }
CELERY_TASK_ALWAYS_EAGER = env_bool("MYRIAD_CELERY_EAGER", False)
# a broker that goes away (Redis restarting) is waited for, however long: the worker never exits
# for it, and runs scheduling cycles from its own timer meanwhile (scheduling.tasks)
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_TIME_LIMIT = env_int("MYRIAD_TASK_TIME_LIMIT", 300, minimum=1)
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
SCHEDULING_CYCLE_INTERVAL_S = env_int("MYRIAD_CYCLE_INTERVAL_S", 5, minimum=1)
# the least time between the starts of two cycles that submits and changes ask for (scheduling.trigger)
CYCLE_MIN_INTERVAL_S = env_float("MYRIAD_CYCLE_MIN_INTERVAL_S", 1.0, minimum=0.0)
# a queue with work pending and nothing admitted this long is starving (the queue history; the
# alert MyriadQueueStarving reads two hours too)
QUEUE_STARVING_AFTER_S = env_float("MYRIAD_QUEUE_STARVING_AFTER_S", 7200.0, minimum=60.0)
# the time one scheduling cycle may take before docs/alerts pages (its p99 over 10 min, above it)
CYCLE_BUDGET_S = env_float("MYRIAD_CYCLE_BUDGET_S", 2.0, minimum=0.01)
# GPUs one scheduling cycle may start; the rest go in the next cycle, run at once (0: no limit).
# Each started GPU is one allocation row written inside the cycle's transaction: 50,000 keeps the
# worst cycle at 100k GPUs near half a second and fills an empty 100k cluster in two cycles
# (README, Benchmarks).
CYCLE_MAX_START_GPUS = env_int("MYRIAD_CYCLE_MAX_START_GPUS", 50_000, minimum=0)
# jobs one scheduling cycle may start (0: no limit); each cycle also reads no more than this many
# pending jobs of one job array, so a 100,000-job array costs a cycle what its first jobs do
CYCLE_MAX_STARTS = env_int("MYRIAD_CYCLE_MAX_STARTS", 1_000, minimum=0)
# gangs that may span datacenters (topology region or any) do so "never", "whenever" one datacenter
# does not hold them, or when it "pays": the wait saved beats the modelled slowdown x duration by
# this margin (engine.sites); placements take a datacenter link up to this share of its capacity
SPAN_POLICY = env_choice("MYRIAD_SPAN_POLICY", "pays", ("never", "whenever", "pays"))
SPAN_MARGIN = env_float("MYRIAD_SPAN_MARGIN", 0.1, minimum=0.0)
LINK_MAX_SHARE = env_float("MYRIAD_LINK_MAX_SHARE", 0.9, minimum=0.01)
# a job crossing a link that became this much slower than in one datacenter (lanes lost) moves
# into one datacenter or shrinks into one (elastic) when that finishes sooner (engine.linkreplan.replan)
SPAN_REPLAN_SLOWDOWN = env_float("MYRIAD_SPAN_REPLAN_SLOWDOWN", 0.2, minimum=0.0)
AUTOSCALE_INTERVAL_S = env_int("MYRIAD_AUTOSCALE_INTERVAL_S", 30, minimum=1)
SIMULATED_FLEET = env_bool("MYRIAD_SIMULATED_FLEET", False)
FLEET_TICK_S = env_int("MYRIAD_FLEET_TICK_S", 5, minimum=1)
FLEET_ACCELERATE = env_int("MYRIAD_FLEET_ACCELERATE", 60, minimum=1)
FLEET_ARRIVALS = env_bool("MYRIAD_FLEET_ARRIVALS", True)
SAMPLE_INTERVAL_S = env_int("MYRIAD_SAMPLE_INTERVAL_S", 60, minimum=1)
# Real nodes (cluster.agents, monitoring.telemetry.ingest, scheduling.launch; README, "Real nodes")
# a GPU held by a running job is idle below this utilization (%), and wasted once idle this long
# (frame time); per-job efficiency counts the GPU-hours below it (monitoring.telemetry.efficiency)
IDLE_UTIL_PCT = env_int("MYRIAD_IDLE_UTIL_PCT", 5, minimum=1)
IDLE_AFTER_S = env_float("MYRIAD_IDLE_AFTER_S", 1800.0, minimum=0.0)
AGENT_HEARTBEAT_TIMEOUT_S = env_int("MYRIAD_AGENT_HEARTBEAT_TIMEOUT_S", 15, minimum=5)  # 3 reports of 5 s
# a job on real nodes hangs when no rank's step moved for max(steps x its step time, floor) seconds;
# a rank is a straggler when its compute is this many percent over the job's median (engine.progress)
PROGRESS_HANG_STEPS = env_int("MYRIAD_PROGRESS_HANG_STEPS", 3, minimum=1)
PROGRESS_HANG_FLOOR_S = env_int("MYRIAD_PROGRESS_HANG_FLOOR_S", 30, minimum=1)
PROGRESS_STRAGGLER_SHARE = env_int("MYRIAD_PROGRESS_STRAGGLER_PERCENT", 10, minimum=1) / 100
# every agent of a datacenter (at least this many) silent at once is a partition, not node faults
PARTITION_MIN_NODES = env_int("MYRIAD_PARTITION_MIN_NODES", 2, minimum=1)
AGENT_WATCH_INTERVAL_S = env_int("MYRIAD_AGENT_WATCH_INTERVAL_S", 5, minimum=1)
# a fabric link is congested while its worst port's p99 window utilization (percent) or its ports'
# CNPs per second reach these; congested this long (seconds) opens a congestion record
FABRIC_CONGESTED_P99 = env_int("MYRIAD_FABRIC_CONGESTED_P99", 90, minimum=1)
FABRIC_CONGESTED_CNP_PER_S = env_int("MYRIAD_FABRIC_CONGESTED_CNP_PER_S", 5000, minimum=1)
FABRIC_CONGESTION_MIN_S = env_int("MYRIAD_FABRIC_CONGESTION_MIN_S", 30, minimum=0)
# a NIC port that flaps this many times within an hour is a fault (nic_link_flap: the node is cordoned)
NIC_FLAPS_PER_HOUR = env_int("MYRIAD_NIC_FLAPS_PER_HOUR", 3, minimum=1)
AGENT_REPORT_MAX_BYTES = env_int("MYRIAD_AGENT_REPORT_MAX_BYTES", 262_144, minimum=4096)
AGENT_INGEST_THREADS = env_int("MYRIAD_AGENT_INGEST_THREADS", 8, minimum=1)
# threads per server process that serve machine clients' API calls (config.machine_api; each keeps its
# database connection)
API_THREADS = env_int("MYRIAD_API_THREADS", 4, minimum=1)
# past capacity a tenant's API call is shed (503 + Retry-After) rather than queued: when this many
# wait or run in one server process, or when it waited this long for a thread (config.machine_api)
API_MAX_IN_FLIGHT = env_int("MYRIAD_API_MAX_IN_FLIGHT", 64, minimum=1)
API_QUEUE_TIMEOUT_S = env_float("MYRIAD_API_QUEUE_TIMEOUT_S", 0.5, minimum=0.01)
LAUNCH_READY_TIMEOUT_S = env_int("MYRIAD_LAUNCH_READY_TIMEOUT_S", 300, minimum=5)
LAUNCH_FAILURE_LIMIT = env_int("MYRIAD_LAUNCH_FAILURE_LIMIT", 5, minimum=1)
SIMULATION_LEASE_S = env_int("MYRIAD_SIMULATION_LEASE_S", 120, minimum=2)
LAUNCH_LOG_TAIL_CHARS = env_int("MYRIAD_LAUNCH_LOG_TAIL_CHARS", 8000, minimum=100)
# --- Job webhooks (scheduling.webhooks): addresses inside this network a URL may name, how often
# they are sent, how long one post may take, how often and how far apart a failed one is retried
WEBHOOK_ALLOW = env_networks("MYRIAD_WEBHOOK_ALLOW")
WEBHOOK_INTERVAL_S = env_int("MYRIAD_WEBHOOK_INTERVAL_S", 10, minimum=1)
WEBHOOK_TIMEOUT_S = env_float("MYRIAD_WEBHOOK_TIMEOUT_S", 5.0, minimum=0.1)
WEBHOOK_RESOLVE_S = env_float("MYRIAD_WEBHOOK_RESOLVE_S", 1.0, minimum=0.01)
WEBHOOK_MAX_ATTEMPTS = env_int("MYRIAD_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
WEBHOOK_BACKOFF_S = env_float("MYRIAD_WEBHOOK_BACKOFF_S", 30.0, minimum=0.0)
# --- Expected starts (scheduling.forecast): how often every pending job's start is played again,
# the window of past submissions that sets the arrivals to come, and how far ahead the play looks
FORECAST_INTERVAL_S = env_int("MYRIAD_FORECAST_INTERVAL_S", 60, minimum=5)
FORECAST_WINDOW_S = env_int("MYRIAD_FORECAST_WINDOW_S", 6 * 3600, minimum=60)
FORECAST_HORIZON_S = env_int("MYRIAD_FORECAST_HORIZON_S", 7 * 86400, minimum=3600)
# --- Job arrays (scheduling.arrays): the most jobs one array submit may create
ARRAY_MAX_SIZE = env_int("MYRIAD_ARRAY_MAX_SIZE", 100_000, minimum=1)
CELERY_BEAT_SCHEDULE = {
    "forecast-starts": {
        "task": "scheduling.tasks.forecast_starts",
        "schedule": float(FORECAST_INTERVAL_S),
        "options": {"expires": float(FORECAST_INTERVAL_S)},  # a late refresh is dropped, not queued
    },
    "scheduling-cycle": {
        "task": "scheduling.tasks.run_scheduling_cycle",
        "schedule": float(SCHEDULING_CYCLE_INTERVAL_S),
    },
    "autoscale-services": {
        "task": "scheduling.tasks.autoscale_services",
        "schedule": float(AUTOSCALE_INTERVAL_S),
    },
    "sample-cluster": {
        "task": "monitoring.tasks.sample_cluster",
        "schedule": float(SAMPLE_INTERVAL_S),
    },
    "watch-agents": {
        "task": "monitoring.tasks.watch_agents",
        "schedule": float(AGENT_WATCH_INTERVAL_S),
    },
    "deliver-webhooks": {
        "task": "scheduling.tasks.deliver_webhooks",
        "schedule": float(WEBHOOK_INTERVAL_S),
    },
    "watch-simulations": {
        "task": "monitoring.tasks.watch_simulations",
        "schedule": float(max(1, SIMULATION_LEASE_S // 3)),
    },
}
if SIMULATED_FLEET:
    CELERY_BEAT_SCHEDULE["fleet-tick"] = {
        "task": "monitoring.tasks.fleet_tick",
        "schedule": float(FLEET_TICK_S),
    }
CELERY_TIMEZONE = "UTC"
# --- Celery queues by role (docs/deploy.md): each role can have workers of its own ------------
# cycle: the scheduling cycle (one at a time under its lock; one worker, concurrency 1);
# faults: fault handling, so a long simulation never delays a recovery; simulations: what-ifs,
# one task per configuration of a sweep; celery: the rest (fleet tick, samples, agents' watch).
CELERY_QUEUE_NAMES = ("cycle", "faults", "simulations", "celery")
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_ROUTES = {
    "scheduling.tasks.run_scheduling_cycle": {"queue": "cycle"},
    "monitoring.tasks.handle_fault_task": {"queue": "faults"},
    "monitoring.tasks.run_simulation_task": {"queue": "simulations"},
    "monitoring.tasks.run_simulation_part": {"queue": "simulations"},
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a worker reserves one task at a time: none waits behind a long one

# --- Prometheus scrapes: a bearer token, or addresses allowed without one ----------------------
METRICS_TOKEN = env_str("MYRIAD_METRICS_TOKEN", "")
METRICS_ALLOW = env_networks("MYRIAD_METRICS_ALLOW")

# --- Auth, API --------------------------------------------------------------------------------
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes anonymous requests get 401, not 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "cluster.api.authentication.TokenAuthentication",
        "cluster.api.authentication.NodeCredentialAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["cluster.permissions.RolePermission"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "cluster.api.search.SearchFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "cluster.api.pagination.StandardPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "cluster.api.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "cluster.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
# --- brute force and floods (cluster.api.throttling): 429 with Retry-After, nothing changed ------
NUM_PROXIES = env_int("MYRIAD_TRUSTED_PROXIES", 0, minimum=0)  # proxies whose X-Forwarded-For is believed
REST_FRAMEWORK["NUM_PROXIES"] = NUM_PROXIES
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {
    "submit": env_str("MYRIAD_SUBMIT_RATE", "6000/min"),  # job submits per user
    "enrol": env_str("MYRIAD_ENROL_RATE", "60/min"),  # enrolment attempts per address
}
FAILURE_LIMITS = {  # kind: (failed attempts from one address, seconds it is then locked out)
    "login": (
        env_int("MYRIAD_LOGIN_FAILURES", 10, minimum=1),
        env_int("MYRIAD_LOGIN_LOCKOUT_S", 300, minimum=1),
    ),
    "token": (
        env_int("MYRIAD_TOKEN_FAILURES", 20, minimum=1),
        env_int("MYRIAD_TOKEN_LOCKOUT_S", 300, minimum=1),
    ),
}
CACHES = (
    {"default": {"BACKEND": "config.cache.SharedPoolRedisCache", "LOCATION": REDIS_URL}}
    if REDIS_URL
    else {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
)
# Request bodies: at most this many bytes (a 413 says so) and this deep in JSON (a 400 says so)
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
MYRIAD_API_MAX_JSON_DEPTH = 32
SPECTACULAR_SETTINGS = {
    "TITLE": "Myriad API",
    "DESCRIPTION": "Inventory, scheduling and health of GPU clusters of 10,000 to 100,000 accelerators.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "cluster.api.schema.add_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "NodeStateEnum": "cluster.choices.NodeState",
        "GPUStateEnum": "cluster.choices.GPUState",
        "GPUHealthEnum": "cluster.choices.GPUHealth",
        "JobStateEnum": "scheduling.choices.JobState",
        "PendingKindEnum": "scheduling.choices.PendingKind",
        "JobKindEnum": "scheduling.choices.JobKind",
        "JobEventKindEnum": "scheduling.choices.EventKind",
        "TopologyConstraintEnum": "scheduling.choices.TopologyConstraint",
        "ReclaimPolicyEnum": "scheduling.choices.ReclaimPolicy",
        "WithinQueuePolicyEnum": "scheduling.choices.WithinQueuePolicy",
        "CheckpointKindEnum": "scheduling.choices.CheckpointKind",
        "FaultSourceEnum": "monitoring.choices.FaultSource",
        "FaultActionEnum": "monitoring.choices.FaultAction",
        "SeverityEnum": "monitoring.choices.Severity",
    },
    # The API's description is public; the data behind it is not.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
}

# --- Static files, i18n -----------------------------------------------------------------------
STATIC_URL = "/static/"
# every asset is served by this server (static/vendor/plotly: plotly.js's cartesian bundle);
# browsers here have no internet
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve static files straight from the app folders too, so the site works without collectstatic.
WHITENOISE_USE_FINDERS = True
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("MYRIAD_LOG_LEVEL", "INFO")},
}
