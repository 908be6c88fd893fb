"""Process supervision: `polar proxy --workers N`, N gateway processes behind one haproxy front."""
