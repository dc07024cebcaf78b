"""How deploy/install.sh adds the gateway to a mosquitto that may already serve others.

Standard library only: install.sh and uninstall.sh run it with the system's python3
(``PYTHONPATH=deploy python3 -m mosquitto_layout``), before the gateway's venv exists. It reads
the files mosquitto reads, models who can connect to which listener and reach which topics,
plans the gateway's own listeners (``per_listener_settings true``) so that every other client
keeps exactly what it had, and checks that plan by modelling its result. docs/deployment.md,
"A broker already in use".
"""

__all__: list[str] = []
