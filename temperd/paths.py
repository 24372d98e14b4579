"""Where temperd keeps its files on the host: one home for each default path.

Every stage imports these (the configuration's defaults, the trace lock, the native backend's
state); nothing else spells them.
"""

CONFIG_DIR = "/etc/temper"
PROFILE_DIR = CONFIG_DIR + "/profiles.d"
RUN_DIR = "/run/temper"  # the systemd unit's RuntimeDirectory
CONTROL_SOCKET = RUN_DIR + "/temperd.sock"
TRACE_LOCK = RUN_DIR + "/trace.lock"
TRACE_DIR = RUN_DIR + "/traces"
STATE_DIR = "/var/lib/temper"  # the unit's StateDirectory: what outlives reboots
USAGE_HISTORY = STATE_DIR + "/usage-history.json"
