"""The commented configuration file that ``svc-gateway config example`` prints.

Every key of every table is in it with its default (or a typical value), so that an
operator starts from a file that loads (tests/config/test_config_docs.py loads it, and
its commented-out tables too, with the real loader). Conventions of the text: prose
comments start with ``# ``; a commented-out setting or table starts with ``#`` right
before the key or the bracket (remove the ``#`` to use it). docs/CONFIG.md explains each key.
"""

from __future__ import annotations

EXAMPLE = """\
# svc-gateway configuration (TOML). Reference: docs/CONFIG.md.
# Run with: svc-gateway serve --config gateway.toml   (check: svc-gateway config check gateway.toml)
# Precedence, highest first: command-line flags, SVC_* environment variables, this file,
# the embedded defaults. Every key below shows its default unless it says otherwise.

[server]
host = "127.0.0.1"                  # address to listen on (SVC_SERVER_HOST)
port = 8080                         # 0 picks a free port (SVC_SERVER_PORT)
db = "svc-gateway.db"               # SQLite file, or "postgresql://user@host:5432/dbname"
workers = 1                         # serving processes on the port; "auto": one per core
request_timeout_s = 300             # a model call's time limit (spec: about 300 s)
keepalive_s = 15                    # keep-alive comment on streams (spec: every 15 s)
shards = 16                         # key-state actors
#platform_rpm = 6000                # requests per minute over all keys (default: none)
rotation_grace_s = 86400            # a rotated key's old token stays valid this long
shutdown_grace_s = 25               # on SIGTERM, calls in progress may take this long
drain_s = 0                         # after SIGTERM, /readyz says stopping this long first
max_body_bytes = 10485760           # larger request bodies: 413 request_too_large
body_timeout_s = 30                 # a request body must arrive whole within this long
max_buffered_body_bytes = 33554432  # large bodies held in memory at once, all requests
max_connections = 1000              # open client connections
max_connections_per_client = 500    # open connections of one client address (half the cap)
public_catalog_rpm = 60             # keyless GET /v1/models per IP address per minute
connection_idle_s = 30              # an idle kept-alive connection is closed after this
webhook_retry_s = 5                 # spend-alert webhook: first retry after this, doubling
webhook_max_attempts = 12           # spend-alert webhook: attempts before giving up
log_format = "text"                 # or "json": one JSON object per line
log_level = "info"                  # debug, info, warning, error, critical
metrics = true                      # GET /metrics (false: 404)
#metrics_token = "change-me"        # set: GET /metrics needs this bearer token

[cluster]                           # only with a postgresql:// db: several nodes
#node_id = "gw-1"                   # default: host name and pid (SVC_CLUSTER_NODE_ID)
lease_s = 10                        # a lease lasts this long without renewal

[observability]                     # OpenTelemetry traces over OTLP/HTTP
#otlp_endpoint = "http://127.0.0.1:4318"  # set: export spans there; unset: no traces
service_name = "svc-gateway"        # the spans' service.name
sample_ratio = 1.0                  # share of new traces recorded, 0 to 1
batch_delay_s = 5.0                 # wait between two exports
export_timeout_s = 10.0             # one export, its retries included
queue_size = 2048                   # spans waiting for export, at most

[cache]                             # the response cache (off unless enabled)
enabled = false                     # true: identical calls answered from the store, free
mode = "deterministic"              # deterministic (temperature 0 or a seed) | all
ttl_s = 3600                        # an entry is served this long
max_entries = 100000                # the sweep drops the oldest past this
scope = "org"                       # org: an organisation's keys share entries | key

# Providers. Live keys are served by real providers only; sandbox keys always by the
# deterministic mock, whatever provider a model names. A model that names only the
# mock refuses live keys (503 model_unavailable).

[[providers]]
name = "mock"
kind = "mock"                       # the deterministic mock: sandbox keys only
zero_retention = true
residency = ["us", "eu"]

[[providers]]
name = "openai"
kind = "openai"                     # any OpenAI-compatible HTTP API (vLLM, Ollama, ...)
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"      # the variable holding the key; serve refuses to start
                                    # when it is not set (leave the key out: no key sent)
zero_retention = false              # the provider keeps no content and does not train
residency = []                      # zones served; empty: every zone
timeout_s = 300                     # connect-to-answer limit of one upstream call
max_connections = 100               # pooled connections to this provider

# Native kinds (docs/providers/): remove the "#" of a table's lines to use it.

#[[providers]]
#name = "anthropic"
#kind = "anthropic"                 # the Messages API
#base_url = "https://api.anthropic.com"
#api_key_env = "ANTHROPIC_API_KEY"
#anthropic_version = "2023-06-01"

#[[providers]]
#name = "gemini"
#kind = "gemini"                    # the Gemini API (key sent as x-goog-api-key)
#base_url = "https://generativelanguage.googleapis.com"
#api_key_env = "GEMINI_API_KEY"

#[[providers]]
#name = "bedrock"
#kind = "bedrock"                   # Bedrock Runtime Converse, SigV4
#region = "us-east-1"               # required
#access_key_id_env = "AWS_ACCESS_KEY_ID"
#secret_access_key_env = "AWS_SECRET_ACCESS_KEY"
#session_token_env = "AWS_SESSION_TOKEN"

#[[providers]]
#name = "azure"
#kind = "azure"                     # Azure OpenAI
#base_url = "https://my-resource.openai.azure.com"
#api_key_env = "AZURE_OPENAI_API_KEY"
#api_version = "2024-10-21"         # set: the deployments surface; absent: /openai/v1

# Models: the catalog. Prices in USD per million tokens (without a price a model
# answers 403 model_not_priced).

[[models]]
id = "gpt-4o-mini"
provider = "openai"
upstream_id = "gpt-4o-mini"         # the provider's name of the model (default: id)
kind = "chat"                       # or "embedding"
capabilities = ["tools", "structured_output", "vision", "web_search"]
zero_retention_available = false    # zero_retention keys may call it
byok_available = true               # BYOK keys may call it
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
cache_read_usd_per_mtok = 0.075     # default: the input price
cache_write_usd_per_mtok = 0.15     # default: the input price
enabled = true                      # false: 503 model_unavailable until switched on
aliases = ["gpt-4o-mini-latest"]    # other names clients may call it by

[[models]]
id = "gpt-4o"                       # served by several deployments (docs/decisions/routing.md)
kind = "chat"
capabilities = ["tools", "structured_output", "vision"]
context_window = 128000             # prompt and output tokens it holds (a fallback must hold
                                    # the request's estimate); default: not checked
tokenizer = "o200k"                 # how a call's prompt tokens are counted for its reservation:
                                    # "o200k" | "cl100k" (OpenAI's, exact, offline) | "bytes"
                                    # (default: the UTF-8 byte bound, for any other model)
input_usd_per_mtok = 2.50
output_usd_per_mtok = 10.00
routing = "weighted"                # ordered | weighted | least_busy | latency
max_attempts = 3                    # attempts over deployments and fallbacks, before the
                                    # first byte reaches the client
first_byte_timeout_s = 100          # an attempt but the last with no byte by then is given
                                    # up (default: request_timeout_s / max_attempts)
fallbacks = ["gpt-4o-mini"]         # tried only if the key could call them itself

[[models.deployments]]              # instead of provider and upstream_id on the model
provider = "openai"
upstream_id = "gpt-4o"
weight = 3                          # share of calls under weighted routing (default 1)
rpm = 10000                         # the upstream account's limits, counted per node
tpm = 2000000

[[models.deployments]]
provider = "openai"                 # e.g. a second account or region (another provider)
upstream_id = "gpt-4o-2024-11-20"
weight = 1

[[models]]
id = "text-embedding-3-small"
provider = "openai"
kind = "embedding"                  # at most one embedding model is served
dimensions = 1536                   # the default (and largest) output dimensions
input_usd_per_mtok = 0.02
output_usd_per_mtok = 0.0

[[models]]
id = "mock-basic"
provider = "mock"                   # sandbox keys only
input_usd_per_mtok = 0.10
output_usd_per_mtok = 0.20

# Guardrails: content rules on model calls, applied where an organisation's policy
# (`guardrails`) or a key's `guardrails` setting names them (docs/CONFIG.md).

#[[guardrails]]
#name = "pii"
#kind = "pii"                       # regex | pii | secrets | webhook
#on = "both"                        # input | output | both
#action = "redact"                  # deny | redact | flag
#entities = ["email", "phone", "credit_card", "iban", "us_ssn", "ip_address"]

#[[guardrails]]
#name = "no-secrets"
#kind = "secrets"                   # provider API keys, tokens, private keys, svc tokens
#on = "input"
#action = "deny"

#[[guardrails]]
#name = "tickets"
#kind = "regex"
#patterns = ["ACME-[0-9]{6}"]       # RE2 syntax: linear time, no backreferences
#action = "flag"

#[[guardrails]]
#name = "acme-filter"
#kind = "webhook"
#url = "http://127.0.0.1:7100/check"
#timeout_s = 2
#on_error = "deny"                  # fail closed: a webhook down or late denies

# MCP servers behind POST /mcp (their tools appear as name__tool); sandbox keys reach only
# the built-in "mock" server
#[[mcp_servers]]
#name = "search"
#url = "http://127.0.0.1:7000/mcp"  # a Streamable HTTP server; or command = [...] (stdio)
#headers_env = { Authorization = "SEARCH_TOKEN" }  # header = environment variable
#usd_per_call = 0.002               # reserved and settled per tools/call
#tool_usd_per_call = { web_lookup = 0.01 }
#zero_retention_available = false  # zero_retention keys reach only servers that keep nothing
#timeout_s = 60                     # past it the call is an isError result naming the server

#[[mcp_servers]]
#name = "files"
#command = ["python", "-m", "my_files_server"]  # a stdio server, supervised by the gateway
"""
