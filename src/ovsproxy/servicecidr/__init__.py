"""servicecidr"""
