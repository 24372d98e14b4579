"""The control protocol between temperd and its clients: a Unix stream socket speaking one JSON
object per line.

A request is one line holding a JSON object {"cmd": NAME, ...} of at most MAX_REQUEST bytes.
Every reply is one line holding a JSON object: {"ok": true, ...} with the command's answer, or
{"ok": false, "error": TEXT}, TEXT being one line that says what was wrong and what was
expected. A line that is not JSON, not an object, too long, or names no command gets that error
reply like any other refusal; before its reply a long command (trace) may send progress lines
{"progress": true, ...}. A client may send several requests on one connection.

Privileged actions (reload, trace capture) only ever go over this socket, never over TCP. This
package sits below both the daemon, whose server (daemon/control.py) speaks it, and temperctl.
"""
