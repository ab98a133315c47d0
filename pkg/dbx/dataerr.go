package dbx

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// MySQL and MariaDB error numbers of values the server refuses, for IsDataError.
const (
	erBadNullError              = 1048 // column cannot be null
	erDupUnique                 = 1169 // can't write, because of unique constraint
	erNoReferencedRow           = 1216 // a foreign key's parent row is missing (older servers)
	erRowIsReferenced           = 1217 // a row other rows reference (older servers)
	erWarnDataOutOfRange        = 1264 // out of range value for a column
	warnDataTruncated           = 1265 // data truncated for a column
	erTruncatedWrongValue       = 1292 // incorrect or truncated value (a datetime, a number)
	erInvalidCharacterString    = 1300 // invalid character string in the connection's charset
	erDivisionByZero            = 1365 // division by 0 in strict mode
	erTruncatedWrongValueField  = 1366 // incorrect string or number value for a column
	erIllegalValueForType       = 1367 // illegal value found during parsing
	erDataTooLong               = 1406 // data too long for a column
	erWrongValueForType         = 1411 // incorrect value for a function
	erRowIsReferenced2          = 1451 // a row other rows reference
	erNoReferencedRow2          = 1452 // a foreign key's parent row is missing
	erForeignDuplicateKey       = 1557 // an update would duplicate a key through a foreign key
	erDupEntryWithKeyName       = 1586 // duplicate entry, with the key's name
	erDataOutOfRange            = 1690 // a value out of range in an expression
	erForeignDupKeyWithChild    = 1761 // a foreign key's update would duplicate a child's key
	erForeignDupKeyWithoutChild = 1762 // the same, without the child's name
	erDupUnknownInIndex         = 1859 // duplicate entry for a key
	erInvalidJSONText           = 3140 // invalid JSON text (MySQL 8's JSON type)
	erCheckConstraintViolated   = 3819 // a CHECK constraint is violated (MySQL 8)
	erConstraintFailed          = 4025 // a CHECK constraint failed (MariaDB)
)

// IsDataError reports an error the server raised because of the values a statement
// carries. The server may be unable to store a value. Examples are an invalid byte
// sequence, a string too long, a number out of range, a bad datetime or a NULL in a NOT NULL
// column. Or a value may violate a constraint, such as a unique key, a foreign key or a
// CHECK. The same values fail the same way on every attempt, so no retry helps.
//
// On PostgreSQL such errors are every SQLSTATE of class 22, data exception, and of class
// 23, integrity constraint violation. On MySQL and MariaDB they are the error numbers of the
// same meaning, which these servers raise in strict mode.
//
// A unique-key violation is a data error too, whoever's key it is. IsDuplicate reports it.
// A caller whose own statements may race on a key of theirs tells that key apart by the
// name DuplicateKey returns.
func IsDataError(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case erBadNullError, ErDupEntry, erDupUnique, erNoReferencedRow, erRowIsReferenced, erWarnDataOutOfRange,
			warnDataTruncated, erTruncatedWrongValue, erInvalidCharacterString, erDivisionByZero, erTruncatedWrongValueField,
			erIllegalValueForType, erDataTooLong, erWrongValueForType, erRowIsReferenced2, erNoReferencedRow2,
			erForeignDuplicateKey, erDupEntryWithKeyName, erDataOutOfRange, erForeignDupKeyWithChild,
			erForeignDupKeyWithoutChild, erDupUnknownInIndex, erInvalidJSONText, erCheckConstraintViolated, erConstraintFailed:
			return true
		}
		return false
	}
	code := pgCode(err)
	return strings.HasPrefix(code, "22") || strings.HasPrefix(code, "23")
}

// DuplicateKey returns the name of the unique key that a unique-key violation names. On
// PostgreSQL that is the constraint. The name comes without a table in front of it, which
// MySQL 8 adds, as in 'inbox.uk_dedup'. DuplicateKey returns "" for another error, or when
// the server names no key.
func DuplicateKey(err error) string {
	if !IsDuplicate(err) {
		return ""
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		// The message is "Duplicate entry '<value>' for key '<name>'". The value may hold
		// quotes, and the name ends the message.
		const mark = " for key '"
		i := strings.LastIndex(me.Message, mark)
		if i < 0 || !strings.HasSuffix(me.Message, "'") {
			return ""
		}
		name := me.Message[i+len(mark) : len(me.Message)-1]
		if j := strings.LastIndexByte(name, '.'); j >= 0 {
			name = name[j+1:]
		}
		return name
	}
	return pgConstraint(err)
}
