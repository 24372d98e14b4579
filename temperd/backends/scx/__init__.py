"""backends/scx"""
