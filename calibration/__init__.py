"""Warm-up calibration (ECHO Sec. 3.2 "Offline Calibration", App. C.4), importable as
``sglang_echo.calibration`` (this folder is mapped into the package namespace)."""
