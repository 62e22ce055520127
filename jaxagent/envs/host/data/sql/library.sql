-- jaxagent SQL environment: a small lending library (written for jaxagent; book facts are public
-- bibliographic facts, members and loans are invented).
CREATE TABLE authors (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    birth_year INTEGER NOT NULL,
    nationality TEXT NOT NULL
);
CREATE TABLE books (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    author_id INTEGER NOT NULL REFERENCES authors(id),
    year INTEGER NOT NULL,
    genre TEXT NOT NULL,
    copies INTEGER NOT NULL
);
CREATE TABLE members (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    joined_year INTEGER NOT NULL
);
-- return_date is NULL while the book is still out
CREATE TABLE loans (
    id INTEGER PRIMARY KEY,
    book_id INTEGER NOT NULL REFERENCES books(id),
    member_id INTEGER NOT NULL REFERENCES members(id),
    loan_date DATE NOT NULL,
    return_date DATE
);

INSERT INTO authors VALUES
    (1, 'Chinua Achebe', 1930, 'Nigerian'),
    (2, 'Ursula K. Le Guin', 1929, 'American'),
    (3, 'Gabriel Garcia Marquez', 1927, 'Colombian'),
    (4, 'Wislawa Szymborska', 1923, 'Polish'),
    (5, 'Haruki Murakami', 1949, 'Japanese');

INSERT INTO books VALUES
    (1, 'Things Fall Apart', 1, 1958, 'novel', 3),
    (2, 'Arrow of God', 1, 1964, 'novel', 1),
    (3, 'A Wizard of Earthsea', 2, 1968, 'fantasy', 4),
    (4, 'The Left Hand of Darkness', 2, 1969, 'science fiction', 2),
    (5, 'The Dispossessed', 2, 1974, 'science fiction', 2),
    (6, 'One Hundred Years of Solitude', 3, 1967, 'novel', 3),
    (7, 'Love in the Time of Cholera', 3, 1985, 'novel', 1),
    (8, 'View with a Grain of Sand', 4, 1995, 'poetry', 1),
    (9, 'Norwegian Wood', 5, 1987, 'novel', 2),
    (10, 'Kafka on the Shore', 5, 2002, 'novel', 2);

INSERT INTO members VALUES
    (1, 'Olga Petrova', 2019),
    (2, 'Pedro Alves', 2020),
    (3, 'Quinn Harper', 2021),
    (4, 'Rosa Jimenez', 2022),
    (5, 'Sam Whitfield', 2023);

INSERT INTO loans VALUES
    (1, 1, 1, '2024-01-05', '2024-01-20'),
    (2, 3, 1, '2024-02-01', '2024-02-15'),
    (3, 6, 2, '2024-02-03', NULL),
    (4, 9, 3, '2024-02-10', '2024-03-01'),
    (5, 3, 4, '2024-03-02', NULL),
    (6, 4, 1, '2024-03-05', '2024-03-25'),
    (7, 10, 2, '2024-03-11', '2024-04-02'),
    (8, 1, 5, '2024-04-01', NULL),
    (9, 8, 3, '2024-04-15', '2024-04-30'),
    (10, 5, 1, '2024-05-02', NULL),
    (11, 9, 4, '2024-05-06', '2024-05-20'),
    (12, 7, 3, '2024-05-10', NULL);
