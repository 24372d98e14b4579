"""backends/native"""
