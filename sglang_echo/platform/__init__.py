"""sglang_echo.platform: run the real sglang server on a plain CPU without sgl-kernel.

See README.md in this folder for the wiring (finder + .pth, general plugin, attention backend).
"""
