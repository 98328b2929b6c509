SELECT field, field_type, action FROM source_fields WHERE source = $1
