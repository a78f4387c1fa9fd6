"""openflow"""
